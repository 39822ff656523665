"""Issue 21 item 1: a job of one kind that turns stale is never held back by another kind's
backlog, neither in the sensor's scan nor in the run queue (real PostgreSQL, a real instance)."""

from __future__ import annotations

import uuid

import dagster as dg
import sqlalchemy as sa
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin

from recon_dagster.db.jobs import scan_stale
from recon_dagster.reconcile.dispatch import Batch, Claim
from recon_dagster.sensors import run_request_for
from recon_dagster_tests.factories import make_job, make_user
from recon_dagster_tests.reconcile_support import evaluate_sensor, make_defs

RUN_KEY_TAG = "dagster/run_key"
_ORIGIN = RemoteJobOrigin(
    RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("recon_dagster"), "__repository__"), "reconcile_job"
)


def _backlog(db: sa.Engine, kind: str, n: int, *, oldest_minutes: float) -> list[uuid.UUID]:
    user = make_user(db)
    ages = [oldest_minutes - i for i in range(n)]
    return [
        make_job(db, user, provider_kind=kind, provider_task_id=f"{kind}-{m}", started_minutes_ago=m)
        for m in ages
    ]


def _requested(result) -> dict[str, list[str]]:
    by_kind: dict[str, list[str]] = {}
    for rr in result.run_requests:
        by_kind.setdefault(rr.tags["recon/provider_kind"], []).append(rr.run_key)
    return by_kind


def test_a_newer_stale_job_of_another_kind_is_requested_in_the_same_tick(db, instance, media_dir):
    # More due lip-sync rows than one scan reads, all older than the kie-standard job.
    _backlog(db, "kie-lip-sync", 12, oldest_minutes=300)
    [late] = _backlog(db, "kie-standard", 1, oldest_minutes=30)
    defs = make_defs(media_dir, scan_limit=5, single_run_below=3, batch_size=2)

    result = evaluate_sensor(defs, instance)

    assert result.run_requests and _requested(result).get("kie-standard") == [f"{late}:1"]


def test_the_scan_takes_every_kind_in_turn_oldest_first_within_a_kind(db):
    lip = _backlog(db, "kie-lip-sync", 6, oldest_minutes=300)
    veo = _backlog(db, "kie-veo", 3, oldest_minutes=200)
    [std] = _backlog(db, "kie-standard", 1, oldest_minutes=30)
    with db.connect() as conn:
        ids = [r.id for r in scan_stale(conn, limit=5)]
    # Round 1: each kind's oldest, oldest first; round 2 likewise; the limit cuts the rounds.
    assert ids == [lip[0], veo[0], std, lip[1], veo[1]]


def test_queued_backlog_runs_never_hide_a_newer_job_of_another_kind(db, instance, media_dir):
    # The backlog's jobs wait in queued runs (the provider's run slots are busy): they are stale
    # and unleased, so the scan meets them first. The newer kie-standard job is still requested.
    backlog = _backlog(db, "kie-lip-sync", 12, oldest_minutes=300)
    [late] = _backlog(db, "kie-standard", 1, oldest_minutes=30)
    defs = make_defs(media_dir, scan_limit=4, single_run_below=3, batch_size=4)
    job_def = defs.resolve_job_def("reconcile_job")
    for i in range(0, len(backlog), 4):
        chunk = tuple(Claim(j, 1) for j in backlog[i : i + 4])
        rr = run_request_for(Batch("kie-lip-sync", chunk, f"lip:{i}"))
        instance.create_run_for_job(
            job_def, run_config=rr.run_config, tags={**rr.tags, RUN_KEY_TAG: rr.run_key},
            status=dg.DagsterRunStatus.QUEUED, remote_job_origin=_ORIGIN,
        )  # fmt: skip

    result = evaluate_sensor(defs, instance)

    assert _requested(result) == {"kie-standard": [f"{late}:1"]}


def test_small_runs_jump_the_queue_and_may_use_the_spare_provider_slot():
    one = run_request_for(Batch("kie-standard", (Claim(uuid.uuid4(), 1),), "one"))
    many = run_request_for(Batch("kie-lip-sync", tuple(Claim(uuid.uuid4(), 1) for _ in range(50)), "many"))

    assert int(one.tags["dagster/priority"]) > 0
    assert "dagster/priority" not in many.tags
    assert one.tags["recon/provider_lane"] == "kie/small" and many.tags["recon/provider_lane"] == "kie/batch"
