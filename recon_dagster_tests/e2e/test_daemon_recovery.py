"""Crash recovery end to end: a worker process dies mid-poll, a real ``dagster-daemon`` recovers the
job, and a stall-retry of the worker finds it done without creating a second upstream task.

Every part is real and separate: the sandbox runs as its own process on loopback, the worker is a
fresh interpreter killed with SIGKILL, the daemon launches its own run workers, and all of them
share the session's PostgreSQL database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import get_kind
from recon_dagster.core.runtags import job_tag, tagged_job_ids
from recon_dagster.providers import KieResource, UpstreamState
from recon_dagster.sandbox import SandboxServer
from recon_dagster_tests.support.daemon import daemon_process
from recon_dagster_tests.support.factories import balances, make_job, make_user, reserve
from recon_dagster_tests.support.harness import HarnessError, last_json_line, run_worker_script, wait_for
from recon_dagster_tests.support.instance import dagster_home
from recon_dagster_tests.support.reconcile import count, one, usage_status
from recon_dagster_tests.support.sandbox_process import sandbox_process

KIND = "kie-standard"

# What an app worker does: create (or resume) the upstream task, poll it, finalize the job.
WORKER_SCRIPT = """
import json, sys
from recon_dagster.db.engine import get_engine
from recon_dagster.media.store import media_store_from_env
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.finalize import ProviderResult, finalize_job_with_media
from recon_dagster.reconcile.app_worker import JobNoLongerInFlight, run_or_resume

job_id, kind, polls_before_done = sys.argv[1], sys.argv[2], int(sys.argv[3])
providers = providers_from_env()
payload = {
    "model": "flux-dev",
    "sandbox_kind": kind,
    "input": {"prompt": "a lighthouse"},
    "callBackUrl": f"https://app.example/callbacks/{job_id}",
    "sandbox_scenario": {"polls_before_done": polls_before_done},
}
try:
    status = run_or_resume(
        job_id,
        kind,
        lambda cb: providers.run(kind, payload, on_task_created=cb, poll_interval_s=0.2, budget_s=60),
        providers=providers,
    )
except JobNoLongerInFlight as exc:
    print(json.dumps({"no_longer_in_flight": str(exc)}))
    sys.exit(0)
result = finalize_job_with_media(
    get_engine(), media_store_from_env(), job_id, ProviderResult.from_status(status), source="worker"
)
print(json.dumps({"state": status.state.value, "task_id": status.task_id, "ok": result.ok,
                  "reason": result.reason}))
"""


@pytest.fixture
def sandbox_proc(tmp_path: Path):
    with sandbox_process(log_dir=tmp_path) as sb:
        yield sb


def test_sandbox_process_speaks_like_the_in_process_sandbox(sandbox_proc) -> None:
    with SandboxServer() as in_process:
        assert set(sandbox_proc.env) == set(in_process.env())
    task_id = sandbox_proc.add_task(KIND, {"polls_before_done": 0}, task_id="harness-task-1")
    kie = KieResource(base_url=sandbox_proc.env["KIE_BASE_URL"], api_key=sandbox_proc.env["KIE_API_KEY"])
    try:
        assert kie.poll(KIND, task_id).state is UpstreamState.SUCCEEDED
    finally:
        kie.close()
    assert sandbox_proc.poll_count(task_id) == 1
    assert sandbox_proc.creates_total() == 0
    with pytest.raises(HarnessError, match="unknown provider_kind"):
        sandbox_proc.add_task("no-such-kind")


def test_dagster_home_writes_an_instance_on_postgres_without_the_url_in_files(database_url: str) -> None:
    with dagster_home(database_url, max_concurrent_runs=3) as home:
        text = home.dagster_yaml.read_text()
        assert home.storage_url not in text and "DAGSTER_POSTGRES_URL" in text
        with home.instance() as inst:
            assert type(inst.run_coordinator).__name__ == "QueuedRunCoordinator"
            assert inst.run_coordinator.get_run_queue_config().max_concurrent_runs == 3
            assert inst.run_monitoring_enabled
            assert inst.get_runs_count() == 0
        storage_db = home.storage_database
        assert storage_db.endswith("_dagster")
    # Created here, so dropped on exit.
    with sa.create_engine(database_url, poolclass=sa.pool.NullPool).connect() as conn:
        assert (
            conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": storage_db}).first()
            is None
        )


def _start_worker(job_id, sandbox_env: dict[str, str], media_dir: Path, polls: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER_SCRIPT, str(job_id), KIND, str(polls)],
        env={**os.environ, **sandbox_env, "RECON_MEDIA_DIR": str(media_dir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.daemon
def test_worker_killed_mid_poll_is_recovered_by_the_daemon_exactly_once(
    db: sa.Engine, database_url: str, sandbox_proc, tmp_path: Path
) -> None:
    media_dir = tmp_path / "media"
    media_dir.mkdir()
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user, status="processing")
    reserve(db, job, user, 30)
    assert balances(db, user) == (Decimal(70), Decimal(50))

    # 1. A worker creates the upstream task and polls it; it dies (SIGKILL) mid-poll.
    polls_before_done = 40  # at 0.2 s per poll the worker cannot see it finish before the kill
    worker = _start_worker(job, sandbox_proc.env, media_dir, polls_before_done)
    try:
        task_id = wait_for(
            lambda: one(db, "SELECT provider_task_id FROM jobs WHERE id = :j", j=job),
            timeout_s=30,
            what="the worker to persist provider_task_id",
        )
        wait_for(lambda: sandbox_proc.poll_count(task_id) >= 3, timeout_s=30, what="the worker to poll")
    finally:
        worker.send_signal(signal.SIGKILL)
        output = worker.communicate(timeout=10)[0].decode(errors="replace")
    assert worker.returncode == -signal.SIGKILL, output
    polls_at_kill = sandbox_proc.poll_count(task_id)
    assert polls_at_kill < polls_before_done
    row = one(db, "SELECT status FROM jobs WHERE id = :j", j=job)
    assert row == "processing"
    assert usage_status(db, job) == "reserved"
    assert sandbox_proc.creates_for(str(job)) == 1

    # 2. Upstream finishes while nobody watches (our own polls drive the sandbox's task to done).
    kie = KieResource(base_url=sandbox_proc.env["KIE_BASE_URL"], api_key=sandbox_proc.env["KIE_API_KEY"])
    try:
        wait_for(
            lambda: kie.poll(KIND, task_id).state is UpstreamState.SUCCEEDED,
            timeout_s=30,
            interval_s=0,
            what="the upstream task to finish",
        )
    finally:
        kie.close()

    # 3. The row goes stale: its provider call started longer ago than the kind's threshold.
    threshold = get_kind(KIND).stale_threshold + timedelta(minutes=1)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET provider_call_started_at = now() - make_interval(secs => :s) WHERE id = :j"
            ),
            {"s": threshold.total_seconds(), "j": str(job)},
        )

    # 4. The real daemon: its sensor (default RUNNING) dispatches, a queued run recovers the job.
    daemon_env = {
        **sandbox_proc.env,
        "RECON_DATABASE_URL": database_url,
        "RECON_MEDIA_DIR": str(media_dir),
        "RECON_SENSOR_INTERVAL_S": "1",
        "RECON_RECONCILE_CADENCE_S": "1",
    }
    with dagster_home(database_url, max_concurrent_runs=4) as home:
        with daemon_process(home, daemon_env) as daemon:
            wait_for(
                lambda: one(db, "SELECT status FROM jobs WHERE id = :j", j=job) == "completed",
                timeout_s=120,
                interval_s=0.5,
                what=f"job {job} to be completed by a daemon-launched run",
                logs=daemon.log_tail,
            )
            with home.instance() as inst:

                def finished_runs() -> list[dg.DagsterRun]:
                    runs = inst.get_runs(filters=dg.RunsFilter(tags=dict([job_tag(job)])))
                    return runs if runs and all(r.is_finished for r in runs) else []

                runs = wait_for(
                    finished_runs, timeout_s=60, what="the reconcile run to finish", logs=daemon.log_tail
                )
        assert len(runs) == 1, [r.run_id for r in runs]
        run = runs[0]
        assert run.status is dg.DagsterRunStatus.SUCCESS, daemon.log_tail()
        assert run.job_name == "reconcile_job"
        assert run.tags["recon/provider_kind"] == KIND
        assert tagged_job_ids(run.tags) == {str(job)}
        assert run.tags.get("dagster/partition") == KIND

    # Exactly once: one completion, credits committed once, balances debited once, one asset.
    assert usage_status(db, job) == "committed"
    assert count(db, "usage_logs", job) == 1
    assert balances(db, user) == (Decimal(70), Decimal(50))
    assert count(db, "assets", job) == 1
    assert sandbox_proc.creates_for(str(job)) == 1
    assert (
        one(db, "SELECT count(*) FROM reconcile_events WHERE job_id = :j AND outcome = 'recovered'", j=job)
        == 1
    )
    stored = [p for p in media_dir.rglob("*") if p.is_file()]
    assert len(stored) == 1, stored

    # 5. A stall-retry of the worker finds the job already completed: it starts no upstream work at
    #    all (no create, no resume) and says why.
    code, output = run_worker_script(
        WORKER_SCRIPT,
        [str(job), KIND, str(polls_before_done)],
        {**sandbox_proc.env, "RECON_MEDIA_DIR": str(media_dir)},
    )
    assert code == 0, output
    result = last_json_line(output)
    assert "is completed, no longer in flight" in result["no_longer_in_flight"], result
    assert sandbox_proc.creates_for(str(job)) == 1
    assert sandbox_proc.creates_total() == 1
    assert usage_status(db, job) == "committed"
    assert balances(db, user) == (Decimal(70), Decimal(50))
    assert count(db, "assets", job) == 1
