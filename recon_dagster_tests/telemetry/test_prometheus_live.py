"""The real parts: Debian's Prometheus scrapes the endpoint while the reconciler works a KIE outage
against the sandbox (sensor ticks and runs in this process, PostgreSQL), evaluates the shipped
rules, and the alert reaches Debian's Alertmanager naming the provider that is down, and only it.
The scrape's series count after the scenario is printed (docs/benchmarks.md) and bounded by the
declarations, whatever the number of jobs.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import KINDS, provider_names
from recon_dagster.defs.telemetry import ensure_process_telemetry
from recon_dagster.sandbox import Scenario
from recon_dagster.telemetry import setup
from recon_dagster.telemetry.instruments import AGE_BUCKETS
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick
from recon_dagster_tests.support.telemetry import (
    get_json,
    prometheus_stack,
    skip_unless_prometheus,
    telemetry_on,
)

pytestmark = [pytest.mark.slow, pytest.mark.daemon, skip_unless_prometheus()]

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "recon-rules.yaml"
FORBIDDEN_LABELS = {"job_id", "job_ids", "user", "user_id", "task_id", "run_id"}


def _due_again(db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET reconcile_next_at = now() WHERE status IN ('pending', 'processing')")
        )


def _firing(am_url: str, alertname: str) -> list[dict]:
    alerts = get_json(f"{am_url}/api/v2/alerts?active=true")
    return [a for a in alerts if a["labels"].get("alertname") == alertname]


def test_prometheus_scrapes_an_outage_and_alertmanager_gets_that_providers_alert(
    db, instance, media_dir, sandbox, monkeypatch, capsys
):
    with telemetry_on(monkeypatch, RECON_METRICS_PORT="0"):
        ensure_process_telemetry()  # what the first sensor tick of the code server does
        port = setup.prometheus_port()
        assert port
        # The shipped rules as they are, only without their `for:` (seconds here, not minutes).
        rules = re.sub(r"\n(\s+)for: \w+", r"\n\1for: 0s", RULES.read_text())
        with prometheus_stack(port, rules) as (prom, am):
            for _ in range(4):
                stale_job_with_task(
                    db, sandbox, "kie-standard", Scenario(server_error_first=1000, outcome="run_forever")
                )
            for _ in range(2):
                stale_job_with_task(db, sandbox, "replicate-prediction", Scenario(outcome="run_forever"))
            defs = make_defs(media_dir, cadence_seconds=0, single_run_below=2)
            for _ in range(2):
                tick(defs, instance)
                _due_again(db)

            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not _firing(am.url, "ReconProviderDown"):
                time.sleep(1)
            down = _firing(am.url, "ReconProviderDown")
            assert [a["labels"]["provider"] for a in down] == ["kie"], down
            assert down[0]["labels"]["severity"] == "critical"
            assert down[0]["annotations"]["runbook_url"] == "docs/operations.md#reconproviderdown"
            assert down[0]["annotations"]["summary"].startswith("kie is DOWN")

            # The scrape saw the state gauges and the reconciler's own counters of this process.
            def value(promql: str) -> float:
                result = prom.query(promql)
                return float(result[0]["value"][1]) if result else 0.0

            assert value('recon_provider_down{provider="replicate"}') == 0
            assert value('recon_provider_unanswered_jobs{provider="kie"}') == 4
            assert value('sum(recon_jobs_inflight{provider="kie"})') == 4
            # Every KIE job's failed attempt is counted (the second tick may find them not yet due
            # again: how many attempts the two ticks make is the reconciler's, not the exporter's).
            assert value('sum(recon_reconcile_outcomes_total{provider="kie",outcome="error"})') >= 4
            assert value('sum(recon_provider_answers_total{provider="kie",class="5xx"})') >= 8
            assert value('sum(recon_polls_sent_total{provider="replicate"})') >= 4
            assert (
                value('sum(recon_sensor_tick_duration_seconds_count{sensor="stale_inflight_jobs_sensor"})')
                >= 2
            )

            series = int(value('count({__name__=~"recon_.+"})'))
            labels = set(get_json(f"{prom.url}/api/v1/labels")["data"])
            assert not FORBIDDEN_LABELS & labels, labels
            # The gauges keep one series per kind and age bucket whatever the jobs; the counters one
            # per label value seen. A job never adds a series of its own.
            per_kind_age = (len(KINDS) + 1) * len(AGE_BUCKETS) * 2
            assert series <= per_kind_age + 3 * len(provider_names()) + 1 + 200, series
            with capsys.disabled():
                print(f"\n[telemetry] series after the outage scenario: {series} (labels: {sorted(labels)})")
