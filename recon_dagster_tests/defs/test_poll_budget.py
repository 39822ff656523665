"""The sensor never asks for more polls per cadence than the account budget serves.

Per provider, the polls already in queued or running reconcile runs plus the polls a tick requests
never exceed what the account's read budget serves in one cadence; the rest wait their turn,
unleased and with no attempt counted, in whole batches (a backlog is never cut into single-job
runs), shared fairly across the provider's kinds. Another provider's budget is its own. Real
PostgreSQL, a real instance, the real sensor.
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
        make_job(
            db, user, provider_kind=kind, provider_task_id=f"{kind}-{i}", started_minutes_ago=stale + 60 + i
        )
        for i in range(n)
    ]


def _batch_sizes(result) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for rr in result.run_requests or []:
        out.setdefault(rr.tags["recon/provider_kind"], []).append(
            len(rr.run_config["ops"]["claim_and_poll"]["config"]["job_ids"])
        )
    return out


def _requested(result) -> Counter[str]:
    """Jobs requested per kind."""
    out: Counter[str] = Counter()
    for rr in result.run_requests or []:
        out[rr.tags["recon/provider_kind"]] += len(
            rr.run_config["ops"]["claim_and_poll"]["config"]["job_ids"]
        )
    return out


@pytest.fixture
def budgets(monkeypatch, provider_keys):
    """KIE at 60 reads a minute, Replicate at 30 a minute, each its own account (this test's)."""
    monkeypatch.setenv("RECON_LIMITS", "database")
    monkeypatch.setenv("RECON_LIMIT_KIE", f"reads=60/60,account=k-{secrets.token_hex(3)}")
    monkeypatch.setenv("RECON_LIMIT_REPLICATE", f"reads=30/60,account=r-{secrets.token_hex(3)}")
    return {p: polls_per_cadence(account_limits_from_env(p), CADENCE_S) for p in ("kie", "replicate")}


def test_a_tick_requests_no_more_polls_than_a_cadence_of_the_budget_fairly_across_kinds(
    db, instance, media_dir, budgets
) -> None:
    kie = {
        kind: _backlog(db, kind, n)
        for kind, n in (("kie-lip-sync", 60), ("kie-veo", 40), ("kie-standard", 10))
    }
    replicate = _backlog(db, "replicate-prediction", 50)
    defs = make_defs(media_dir, cadence_seconds=CADENCE_S, batch_size=25, single_run_below=2)

    result = evaluate_sensor(defs, instance)

    asked, sizes = _requested(result), _batch_sizes(result)
    kie_cap, rep_cap = budgets["kie"], budgets["replicate"]
    assert 0 < kie_cap < 110 and 0 < rep_cap < 50  # both budgets bind on this backlog
    # At most the cadence's budget, and short of it by less than one batch. Today: all 110.
    kie_batch, rep_batch = max(sizes["kie-veo"]), max(sizes["replicate-prediction"])
    assert kie_cap - kie_batch < sum(asked[k] for k in kie) <= kie_cap
    assert rep_cap - rep_batch < asked["replicate-prediction"] <= rep_cap  # its own budget
    # Fair across kinds: every KIE kind in turn, the smallest first, so a few jobs of one kind are
    # never held back by an older kind's backlog, and the backlogs share what is left.
    assert asked["kie-standard"] == 10 and asked["kie-lip-sync"] == asked["kie-veo"]
    # Whole batches: the budget never cuts a backlog into runs of a few jobs each.
    assert all(n == kie_batch for k in ("kie-lip-sync", "kie-veo") for n in sizes[k]), sizes
    # The rest wait their turn: no lease, no attempt, nothing written by the sensor.
    assert (
        one(db, "SELECT count(*) FROM jobs WHERE reconcile_lease_owner IS NOT NULL OR reconcile_attempts > 0")
        == 0
    )
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

    asked, sizes = _requested(result), _batch_sizes(result)
    assert set(asked) == {"kie-veo"} and budgets["kie"] - 30 - max(sizes["kie-veo"]) < asked["kie-veo"]
    assert asked["kie-veo"] <= budgets["kie"] - 30  # today: all 80
    assert len(later) == 80


def _batch(kind: str, n: int) -> Batch:
    claims = tuple(Claim(uuid.uuid4(), 1) for _ in range(n))
    return Batch(kind, claims, f"{kind}:{n}:{uuid.uuid4().hex[:6]}")


def test_whole_batches_in_fair_turns_and_a_provider_with_nothing_in_flight_never_stalls() -> None:
    lip = [_batch("kie-lip-sync", 20) for _ in range(3)]
    late = [_batch("kie-standard", 1)]
    eleven = [_batch("elevenlabs-async", 50) for _ in range(2)]
    now, later = within_poll_budgets([*lip, *late, *eleven], {"kie": 45, "elevenlabs": None}, {})
    # Turn one: the late kie-standard job first (smallest), then lip-sync's first batch; turn two:
    # lip-sync's second (41 of 45); its third would pass the budget: it and the rest wait.
    assert [b.run_key for b in now if b.provider_kind != "elevenlabs-async"] == [
        late[0].run_key,
        lip[0].run_key,
        lip[1].run_key,
    ]
    assert [b.run_key for b in later] == [lip[2].run_key]
    assert all(b in now for b in eleven)  # no read budget: no cap
    # Polls already in flight count: 40 busy leave room for the late job only.
    now, later = within_poll_budgets([*lip, *late], {"kie": 45}, {"kie": 40})
    assert [b.run_key for b in now] == [late[0].run_key] and len(later) == 3
    # A batch larger than the whole budget still goes when nothing of its provider is in flight.
    now, later = within_poll_budgets([_batch("kie-veo", 500)], {"kie": 45}, {})
    assert len(now) == 1 and later == []
    now, later = within_poll_budgets([_batch("kie-veo", 500)], {"kie": 45}, {"kie": 1})
    assert now == [] and len(later) == 1
