"""The sensor never asks for more polls per cadence than the account budget serves (issue 34).

Per provider, the polls already in queued or running reconcile runs plus the polls a tick requests
never exceed what the account's read budget serves in one cadence; the rest wait their turn,
unleased and with no attempt counted, shared fairly across the provider's kinds. Another
provider's budget is its own. Real PostgreSQL, a real instance, the real sensor.
"""

from __future__ import annotations

import secrets
import uuid
from collections import Counter

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin

from recon_dagster.core.kinds import KINDS
from recon_dagster.core.runtags import RUN_KEY_TAG
from recon_dagster.db.jobs import Claim
from recon_dagster.defs.reconcile.sensors import run_request_for
from recon_dagster.providers.limit_config import account_limits_from_env, polls_per_cadence
from recon_dagster.reconcile.batches import Batch, within_poll_budgets
from recon_dagster_tests.support.factories import make_job, make_user
from recon_dagster_tests.support.reconcile import evaluate_sensor, make_defs, one

_ORIGIN = RemoteJobOrigin(
    RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("recon_dagster"), "__repository__"), "reconcile_job"
)
CADENCE_S = 60


def _backlog(db: sa.Engine, kind: str, n: int) -> list[uuid.UUID]:
    user = make_user(db)
    stale = KINDS[kind].stale_threshold.total_seconds() / 60
    return [
        make_job(db, user, provider_kind=kind, provider_task_id=f"{kind}-{i}", started_minutes_ago=stale + 60 + i)
        for i in range(n)
    ]


def _requested(result) -> Counter[str]:  # noqa: ANN001
    """Jobs requested per kind."""
    out: Counter[str] = Counter()
    for rr in result.run_requests or []:
        out[rr.tags["recon/provider_kind"]] += len(rr.run_config["ops"]["claim_and_poll"]["config"]["job_ids"])
    return out


@pytest.fixture
def budgets(monkeypatch):
    """KIE at 60 reads a minute, Replicate at 30 a minute, each its own account (this test's)."""
    monkeypatch.setenv("RECON_LIMITS", "database")
    monkeypatch.setenv("RECON_LIMIT_KIE", f"reads=60/60,account=k-{secrets.token_hex(3)}")
    monkeypatch.setenv("RECON_LIMIT_REPLICATE", f"reads=30/60,account=r-{secrets.token_hex(3)}")
    return {p: polls_per_cadence(account_limits_from_env(p), CADENCE_S) for p in ("kie", "replicate")}


def test_a_tick_requests_no_more_polls_than_a_cadence_of_the_budget_fairly_across_kinds(
    db, instance, media_dir, budgets
) -> None:
    kie = {kind: _backlog(db, kind, n) for kind, n in (("kie-lip-sync", 60), ("kie-veo", 40), ("kie-standard", 10))}
    replicate = _backlog(db, "replicate-prediction", 50)
    defs = make_defs(media_dir, cadence_seconds=CADENCE_S, batch_size=25, single_run_below=2)

    result = evaluate_sensor(defs, instance)

    asked = _requested(result)
    kie_cap, rep_cap = budgets["kie"], budgets["replicate"]
    assert 0 < kie_cap < 110 and 0 < rep_cap < 50  # both budgets bind on this backlog
    assert sum(asked[k] for k in kie) == kie_cap  # today: all 110
    assert asked["replicate-prediction"] == rep_cap  # its own budget, not KIE's leftovers
    # Fair across kinds: every KIE kind in turn, so none is starved by an older kind's backlog.
    assert asked["kie-standard"] == 10 and abs(asked["kie-lip-sync"] - asked["kie-veo"]) <= 1
    # The rest wait their turn: no lease, no attempt, nothing written by the sensor.
    assert one(db, "SELECT count(*) FROM jobs WHERE reconcile_lease_owner IS NOT NULL OR reconcile_attempts > 0") == 0
    assert len(replicate) == 50


def test_jobs_in_queued_runs_count_against_the_budget(db, instance, media_dir, budgets) -> None:
    """Polls already asked for (runs queued or running) leave only the rest of the cadence's budget."""
    queued = _backlog(db, "kie-lip-sync", 30)
    later = _backlog(db, "kie-veo", 80)
    defs = make_defs(media_dir, cadence_seconds=CADENCE_S, batch_size=30, single_run_below=2)
    job_def = defs.resolve_job_def("reconcile_job")
    rr = run_request_for(Batch("kie-lip-sync", tuple(Claim(j, 1) for j in queued), "queued-lip-sync"))
    instance.create_run_for_job(
        job_def, run_config=rr.run_config, tags={**rr.tags, RUN_KEY_TAG: rr.run_key},
        status=dg.DagsterRunStatus.QUEUED, remote_job_origin=_ORIGIN,
    )  # fmt: skip

    result = evaluate_sensor(defs, instance)

    assert _requested(result) == {"kie-veo": budgets["kie"] - 30}
    assert len(later) == 80


def test_the_split_is_pure_and_leaves_sweepable_rows_and_unbudgeted_providers_alone() -> None:
    from recon_dagster_tests.support.factories import job_row_value

    rows = [job_row_value(kind="kie-standard", task=f"t{i}") for i in range(5)]
    rows += [job_row_value(kind="kie-standard", task=None)]  # nothing to poll: swept in the run
    rows += [job_row_value(kind="elevenlabs-async", task=f"e{i}") for i in range(3)]
    now, later = within_poll_budgets(rows, {"kie": 3, "elevenlabs": None}, {"kie": 1})
    assert [r.provider_task_id for r in now] == ["t0", "t1", None, "e0", "e1", "e2"]
    assert [r.provider_task_id for r in later] == ["t2", "t3", "t4"]
    # Busy beyond the budget (the budget was lowered): nothing more is asked for.
    now, later = within_poll_budgets(rows[:5], {"kie": 3}, {"kie": 7})
    assert now == [] and len(later) == 5
