"""A job of one kind that turns stale is never held back by another kind's
backlog, neither in the sensor's scan nor in the run queue (real PostgreSQL, a real instance)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin

from recon_dagster.core.runtags import JOB_COUNT_TAG
from recon_dagster.db.jobs import scan_stale
from recon_dagster.defs.reconcile.sensors import run_request_for
from recon_dagster.reconcile.batches import Batch, Claim
from recon_dagster_tests.support.daemon import daemon_process
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.harness import wait_for
from recon_dagster_tests.support.instance import dagster_home
from recon_dagster_tests.support.reconcile import evaluate_sensor, make_defs, one, usage_status
from recon_dagster_tests.support.sandbox_process import sandbox_process

RUN_KEY_TAG = "dagster/run_key"
LATE = "kie-standard"
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


def test_a_newer_stale_job_of_another_kind_is_requested_in_the_same_tick(
    db, instance, media_dir, provider_keys
):
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


def test_queued_backlog_runs_never_hide_a_newer_job_of_another_kind(db, instance, media_dir, provider_keys):
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
    # A burst of a few jobs of one kind due in the same tick (packed into one run) is small too.
    few = run_request_for(Batch("kie-standard", tuple(Claim(uuid.uuid4(), 1) for _ in range(10)), "few"))
    assert few.tags["recon/provider_lane"] == "kie/small" and "dagster/priority" in few.tags


def _shipped_run_queue(home_yaml: Path) -> None:
    """The instance's run queue as it ships (dagster.yaml), not the harness's."""
    shipped = yaml.safe_load((Path(__file__).resolve().parents[2] / "dagster.yaml").read_text())["run_queue"]
    config = yaml.safe_load(home_yaml.read_text())
    for key in ("max_concurrent_runs", "tag_concurrency_limits"):
        config["run_queue"][key] = shipped[key]
    home_yaml.write_text(yaml.safe_dump(config, sort_keys=False))


@pytest.mark.daemon
def test_a_stuck_job_is_settled_while_backlog_runs_hold_every_batch_slot(db, database_url, tmp_path):
    # Three long batch runs (two lip-sync, one veo; upstream still running, one job at a time, 3 s
    # per answer) hold every KIE batch run slot; then one kie-standard job turns stale. On the
    # old run queue its run waited for one of them to end (about 90 s).
    interval = 5
    user = make_user(db)
    with sandbox_process(latency_s=3.0, log_dir=tmp_path) as sandbox:
        for kind, n in (("kie-lip-sync", 60), ("kie-veo", 30)):
            for i in range(n):
                task = sandbox.add_task(kind, {"outcome": "run_forever"}, f"{kind}-{i}")
                make_job(db, user, provider_kind=kind, provider_task_id=task, started_minutes_ago=300)
        task = sandbox.add_task(LATE, {"outcome": "succeed", "polls_before_done": 0})
        late = make_job(db, user, provider_kind=LATE, provider_task_id=task)
        reserve(db, late, user, 3)
        env = {
            **sandbox.env,
            "RECON_DATABASE_URL": database_url,
            "RECON_MEDIA_DIR": str(tmp_path / "media"),
            "RECON_SENSOR_INTERVAL_S": str(interval),
            "RECON_BATCH_SIZE": "30",
            "RECON_RECONCILE_CONCURRENCY": "1",
            "RECON_SINGLE_RUN_BELOW": "2",
            "DAGSTER_GRPC_TIMEOUT_SECONDS": "300",
        }
        with dagster_home(database_url) as home:
            _shipped_run_queue(home.dagster_yaml)
            with daemon_process(home, env) as daemon, home.instance() as inst:
                started = dg.RunsFilter(
                    statuses=[dg.DagsterRunStatus.STARTED], tags={"recon/provider": "kie"}
                )

                def batch_runs() -> int:
                    return sum(int(r.tags[JOB_COUNT_TAG]) > 1 for r in inst.get_runs(filters=started))

                wait_for(
                    lambda: batch_runs() >= 3,
                    timeout_s=240,
                    what="three KIE batch runs to start",
                    logs=daemon.log_tail,
                )
                with db.begin() as conn:  # the job turns stale now
                    conn.execute(
                        sa.text(
                            "UPDATE jobs SET provider_call_started_at = now() - interval '1 hour' WHERE id = :j"
                        ),
                        {"j": str(late)},
                    )
                stale_at = time.monotonic()
                wait_for(
                    lambda: one(db, "SELECT status FROM jobs WHERE id = :j", j=late) == "completed",
                    timeout_s=interval + 30,
                    interval_s=0.5,
                    what=f"the stuck {LATE} job to complete while the backlog runs",
                    logs=daemon.log_tail,
                )
                took = time.monotonic() - stale_at
                still = batch_runs()
    assert still >= 1, "the backlog's runs ended first: nothing was held"
    assert took <= interval + 30
    assert usage_status(db, late) == "committed"
