"""One provider's key missing, empty or wrong never stops the other providers (issue 48, item 1).

Each provider's secret concerns its own kinds only. Without a usable key a provider is "not
configured": the sensor requests no run for its kinds, every other provider's stale job is
recovered in the same tick, and the job of the provider without a key keeps its attempts, its
reservation and its place in flight (our configuration is not the job's fault). A wrong key (the
provider answers 401) is our configuration too: no attempt counted, nothing refunded.
Parametrised over the registry, so a provider added later is covered.
"""

from __future__ import annotations

import pytest

from recon_dagster.core.kinds import KINDS, DemoCase, provider_spec, provider_specs
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick, usage_status

pytestmark = pytest.mark.postgres

# One recoverable case per provider that has an async kind (a sync kind is swept, whatever its key).
CASES: dict[str, DemoCase] = {}
for _spec in provider_specs():
    for _case in _spec.demo:
        if KINDS[_case.kind].is_async and _case.scenario == {"polls_before_done": 0}:
            CASES.setdefault(_spec.name, _case)

KEYS = {"missing": None, "empty": "", "blank": "  \n", "wrong": "not-the-sandbox-key"}


def _set_key(monkeypatch: pytest.MonkeyPatch, provider: str, how: str) -> None:
    env = provider_spec(provider).settings.key_env
    value = KEYS[how]
    if value is None:
        monkeypatch.delenv(env, raising=False)
    else:
        monkeypatch.setenv(env, value)


@pytest.mark.slow
@pytest.mark.parametrize("how", list(KEYS))
@pytest.mark.parametrize("broken", [spec.name for spec in provider_specs()])
def test_one_provider_without_a_usable_key_never_stops_the_others(
    db, sandbox, media_dir, instance, monkeypatch, broken: str, how: str
) -> None:
    _set_key(monkeypatch, broken, how)
    jobs = {
        name: stale_job_with_task(
            db, sandbox, case.kind, Scenario(polls_before_done=0), job_type=case.job_type
        )[1]
        for name, case in CASES.items()
    }

    report = tick(make_defs(media_dir), instance)

    for name, job in jobs.items():
        row = job_row(db, job)
        if name == broken:
            # Not the job's fault: no attempt, no refund, still in flight for when the key is set.
            assert row["status"] == "processing", row
            assert row["reconcile_attempts"] == 0, row["reconcile_last_error"]
            assert usage_status(db, job) == "reserved"
        else:
            assert row["status"] == "completed", (name, row["reconcile_last_error"], report.line())
            assert usage_status(db, job) == "committed"
    if how != "wrong":
        # Not configured: no run requested for its kinds.
        assert report.runs == len(jobs) - (broken in jobs)
    assert report.failed_runs == (1 if how == "wrong" and broken in jobs else 0), report.line()


def test_a_provider_without_its_key_is_one_line_in_the_sensor_status_plan_and_health(
    db, sandbox, media_dir, instance, monkeypatch, capsys
) -> None:
    from recon_dagster.cli.commands import main as cli_main
    from recon_dagster.operator.health import HealthPolicy, State, verdicts
    from recon_dagster.operator.status import print_status
    from recon_dagster.providers.resource import not_configured_line
    from recon_dagster_tests.support.reconcile import evaluate_sensor

    monkeypatch.delenv("KIE_API_KEY", raising=False)
    job = stale_job_with_task(db, sandbox, "kie-standard")[1]
    line = not_configured_line("kie")
    assert line.startswith("kie: not configured (KIE_API_KEY is not set)") and "\n" not in line

    result = evaluate_sensor(make_defs(media_dir), instance)
    requested = {
        j for rr in result.run_requests for j in rr.run_config["ops"]["claim_and_poll"]["config"]["job_ids"]
    }
    assert str(job) not in requested
    assert not any(KINDS[rr.partition_key].provider == "kie" for rr in result.run_requests)

    assert print_status() == 0
    assert line in capsys.readouterr().out.splitlines()
    with db.connect() as conn:
        kie = next(v for v in verdicts(conn, HealthPolicy()) if v.provider == "kie")
    assert (kie.state, kie.line, kie.passed) == (State.NOT_CONFIGURED, line, True)
    assert cli_main(["plan", "--no-poll", "--kind", "kie-standard"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == line
    assert job_row(db, job)["reconcile_attempts"] == 0
