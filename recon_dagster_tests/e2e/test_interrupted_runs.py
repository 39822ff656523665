"""A run whose worker goes away mid-run (issue 48): a code server restarted under it the way the
shipped recipes stop one (SIGTERM to the server, then SIGKILL to what is left, as systemd's
``KillMode=mixed`` and Kubernetes' grace period do), or its run worker killed while the code server
lives. Real processes: ``dagster api grpc`` as ``deploy/systemd`` starts it, ``dagster-daemon``
with the shipped ``dagster.yaml``, the sandbox answering each poll slowly so the run is mid-poll.

Each ends the same way: the run is failed (not left STARTED with its jobs spoken for), its jobs are
retaken by a new run with no attempt counted and completed once, charged once, and the alert
sensor opens no incident for it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import psutil
import pytest
from dagster._core.definitions.run_request import InstigatorType
from dagster._grpc.client import DagsterGrpcClient

from recon_dagster.core.kinds import get_kind
from recon_dagster.core.paths import project_root
from recon_dagster.core.runtags import INTERRUPTED_TAG
from recon_dagster.defs.reconcile.vanished import worker_alive
from recon_dagster_tests.support.daemon import daemon_process
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.harness import spawn_logged, stop_tree, venv_script, wait_for
from recon_dagster_tests.support.instance import DagsterHome, dagster_home
from recon_dagster_tests.support.reconcile import one
from recon_dagster_tests.support.sandbox_process import sandbox_process
from recon_dagster_tests.support.topology import code_server_process, free_port, grpc_workspace_yaml

pytestmark = pytest.mark.daemon

ROOT = project_root() or Path(__file__).resolve().parents[2]
KIND = "kie-standard"
# Each poll answers after this long: the first run is mid-poll when its worker goes.
POLL_LATENCY_S = 20
# systemd's TimeoutStopSec (60 s in deploy/systemd), shortened: the server still drains its run
# when the SIGKILL comes.
STOP_TIMEOUT_S = 5


class CodeServer:
    """``dagster api grpc`` on a fixed port, as ``deploy/systemd/recon-dagster-code.service`` runs it."""

    def __init__(self, home: DagsterHome, env: dict[str, str], port: int) -> None:
        self.home, self.env, self.port = home, env, port
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        dagster = venv_script("dagster")
        cmd = [dagster, "api", "grpc", "-m", "recon_dagster.definitions", "--location-name", "recon_dagster",
               "-h", "127.0.0.1", "-p", str(self.port)]  # fmt: skip
        log = self.home.path / f"code-server-{self.starts}.log"
        self.process = spawn_logged(cmd, log, {**self.home.env(), **self.env}, self.home.path)
        health = [dagster, "api", "grpc-health-check", "-p", str(self.port), "-h", "127.0.0.1"]

        def serving() -> bool:
            assert self.process is not None and self.process.poll() is None, log.read_text()[-3000:]
            return subprocess.run(health, capture_output=True, timeout=30).returncode == 0

        wait_for(serving, timeout_s=120, interval_s=0.5, what="the code server")

    def restart(self) -> None:
        """SIGTERM, then SIGKILL to the whole group after ``STOP_TIMEOUT_S`` (``KillMode=mixed``),
        then a new server on the same port."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.start()

    def stop(self) -> None:
        if self.process is not None:
            stop_tree(self.process, timeout_s=20)


def _stale_job(
    db: Any, sandbox: Any, database_url: str, tmp_path: Path, latency_s: float
) -> tuple[Any, Any, dict[str, str]]:
    """One stale KIE job with 2 credits reserved, whose task answers each poll after ``latency_s``;
    and the environment of the processes that reconcile it."""
    user = make_user(db, sub=1000, topup=0)
    task = sandbox.add_task(KIND, {"outcome": "succeed", "polls_before_done": 0, "latency_s": latency_s})
    minutes = get_kind(KIND).stale_threshold.total_seconds() / 60 + 5
    job = make_job(db, user, provider_kind=KIND, provider_task_id=task, started_minutes_ago=minutes)
    reserve(db, job, user, Decimal(2))
    env = {
        **sandbox.env,
        "RECON_DATABASE_URL": database_url,
        "RECON_MEDIA_DIR": str(tmp_path / "media"),
        "RECON_SENSOR_INTERVAL_S": "1",
        "RECON_RECONCILE_CADENCE_S": "1",
    }
    return job, user, env


@contextlib.contextmanager
def _topology(db: Any, database_url: str, tmp_path: Path) -> Iterator[tuple[Any, CodeServer, Any, Any, Any]]:
    """The sandbox, one stale KIE job with 2 credits reserved, a code server and the daemon."""
    with sandbox_process(log_dir=tmp_path) as sandbox:
        job, user, env = _stale_job(db, sandbox, database_url, tmp_path, POLL_LATENCY_S)
        with dagster_home(database_url) as home:
            home.dagster_yaml.write_text((ROOT / "dagster.yaml").read_text())  # as shipped
            server = CodeServer(home, env, free_port())
            home.workspace_yaml.write_text(grpc_workspace_yaml("127.0.0.1", server.port))
            server.start()
            try:
                with daemon_process(home, env) as daemon, home.instance() as inst:
                    yield job, server, daemon, inst, user
            finally:
                server.stop()


def _polling_run(inst: dg.DagsterInstance) -> tuple[dg.DagsterRun, int] | None:
    for run in inst.get_runs(filters=dg.RunsFilter(job_name="reconcile_job")):
        if run.status is not dg.DagsterRunStatus.STARTED:
            continue
        if not inst.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_START):
            continue  # not polling yet
        for engine in inst.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
            found = re.fullmatch(r"Started process for run \(pid: (\d+)\)\.", engine.message or "")
            if found:
                return run, int(found.group(1))
    return None


def _first_polling_run(inst: dg.DagsterInstance, daemon: Any) -> tuple[dg.DagsterRun, int]:
    found: tuple[dg.DagsterRun, int] = wait_for(
        lambda: _polling_run(inst), timeout_s=180, what="a polling run", logs=daemon.log_tail
    )
    return found


def _ended(inst: dg.DagsterInstance, first: dg.DagsterRun, daemon: Any, timeout_s: float) -> dg.DagsterRun:
    def ended() -> dg.DagsterRun | None:
        run = inst.get_run_by_id(first.run_id)
        return run if run is not None and run.is_finished else None

    run: dg.DagsterRun = wait_for(
        ended, timeout_s=timeout_s, interval_s=1, what="the run to end", logs=daemon.log_tail
    )
    return run


def _ticks(inst: dg.DagsterInstance, sensor: str) -> list[Any]:
    for state in inst.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        if state.instigator_name == sensor:
            return list(inst.get_ticks(state.instigator_origin_id, state.selector_id, limit=50))
    return []


def _alert_ticks_after(inst: dg.DagsterInstance, after: float) -> list[Any]:
    ticks = _ticks(inst, "reconcile_alerts")
    return [t for t in ticks if t.timestamp > after and "open incidents:" in (t.tick_data.skip_reason or "")]


def _settled_once(
    db: Any, job: Any, user: Any, inst: dg.DagsterInstance, daemon: Any, first: dg.DagsterRun
) -> None:
    """The job completed by a later run, charged once, its interrupted attempt never counted; the
    alert sensor, having read the failure, has no incident open for reconcile runs."""

    def completed() -> bool:
        return one(db, "SELECT status FROM jobs WHERE id = :j", j=job) == "completed"

    wait_for(
        completed, timeout_s=180, interval_s=1, what="the job completed by a later run", logs=daemon.log_tail
    )
    # Completed at its first counted poll, the counter stays 0: the interrupted run counted nothing
    # (a takeover of its lease after 15 minutes would have counted one).
    assert one(db, "SELECT reconcile_attempts FROM jobs WHERE id = :j", j=job) == 0
    assert one(db, "SELECT string_agg(status, ',') FROM usage_logs WHERE job_id = :j", j=job) == "committed"
    assert one(db, "SELECT count(*) FROM assets WHERE job_id = :j", j=job) == 1
    assert one(db, "SELECT subscription_credits FROM user_credits WHERE user_id = :u", u=user) == 998

    def later_run_succeeded() -> bool:
        runs = inst.get_runs(
            filters=dg.RunsFilter(job_name="reconcile_job", statuses=[dg.DagsterRunStatus.SUCCESS])
        )
        return any(r.run_id != first.run_id for r in runs)

    wait_for(
        later_run_succeeded, timeout_s=60, interval_s=1, what="the later run to succeed", logs=daemon.log_tail
    )
    failed_at = inst.get_run_record_by_id(first.run_id).end_time
    ticks = wait_for(
        lambda: _alert_ticks_after(inst, failed_at + 1),
        timeout_s=120,
        interval_s=2,
        what="an alert tick after the failure",
        logs=daemon.log_tail,
    )
    # Its skip message ends with the incidents open after the tick: none of reconcile runs.
    open_now = ticks[0].tick_data.skip_reason.rsplit("open incidents:", 1)[1]
    assert "runs:reconcile_job" not in open_now, open_now
    # The sensor logs each alert it raises at ERROR, "trigger <incident>: ...": none for these runs.
    assert "trigger runs:reconcile_job" not in daemon.log_tail(500_000)


def test_a_run_whose_code_server_restarts_under_it_is_failed_and_its_job_retaken_without_a_page(
    db, database_url: str, tmp_path: Path
) -> None:
    with _topology(db, database_url, tmp_path) as (job, server, daemon, inst, user):
        first, pid = _first_polling_run(inst, daemon)
        # The run holds the job's lease (claimed at the start of its step) when its server goes.
        wait_for(
            lambda: one(db, "SELECT reconcile_lease_owner FROM jobs WHERE id = :j", j=job) is not None,
            timeout_s=30, interval_s=0.2, what="the run's lease on its job", logs=daemon.log_tail,
        )  # fmt: skip
        server.restart()
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        # Without fail_vanished_runs the run stays STARTED for good (nothing records its end).
        run = _ended(inst, first, daemon, timeout_s=150)
        assert run.status is dg.DagsterRunStatus.FAILURE
        assert run.tags.get(INTERRUPTED_TAG) == "worker_gone"
        assert run.tags.get("dagster/failure_reason") == "UNEXPECTED_TERMINATION"
        _settled_once(db, job, user, inst, daemon, first)


def test_a_run_whose_worker_is_killed_is_retaken_without_a_page(
    db, database_url: str, tmp_path: Path
) -> None:
    with _topology(db, database_url, tmp_path) as (job, _server, daemon, inst, user):
        first, pid = _first_polling_run(inst, daemon)
        os.kill(pid, signal.SIGKILL)  # the OOM killer's way: the code server lives and notices
        run = _ended(inst, first, daemon, timeout_s=60)
        assert run.status is dg.DagsterRunStatus.FAILURE
        _settled_once(db, job, user, inst, daemon, first)


def test_a_worker_is_alive_only_as_the_process_that_began_before_its_run() -> None:
    me = psutil.Process()
    assert worker_alive(me.pid, time.time())
    # The same pid for a process that began after the run did: reused, not the run's worker.
    assert not worker_alive(me.pid, me.create_time() - 60)
    assert not worker_alive(None, time.time())
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not worker_alive(gone.pid, time.time())


def test_a_reloaded_code_server_never_gets_its_previous_childs_runs_failed(
    db, database_url: str, tmp_path: Path
) -> None:
    """``dagster code-server start`` answers ``CanCancelExecution`` for its current child only: after
    a "Reload location" the previous child still works its run, and that run is left to finish."""
    with sandbox_process(log_dir=tmp_path) as sandbox:
        job, _user, env = _stale_job(db, sandbox, database_url, tmp_path, 75)
        with dagster_home(database_url) as home, contextlib.ExitStack() as stack:
            home.dagster_yaml.write_text((ROOT / "dagster.yaml").read_text())  # as shipped
            server = stack.enter_context(code_server_process(home, env))
            daemon = stack.enter_context(daemon_process(home, env))
            inst = stack.enter_context(home.instance())
            first, _pid = _first_polling_run(inst, daemon)
            reloaded = time.time()
            DagsterGrpcClient(port=server.port, host="127.0.0.1").reload_code(timeout=120)
            run = _ended(inst, first, daemon, timeout_s=240)
            ended_at = inst.get_run_record_by_id(run.run_id).end_time
            # fail_vanished_runs looked while the run still worked in the previous child ...
            looked = [t for t in _ticks(inst, "fail_vanished_runs") if reloaded < t.timestamp < ended_at]
            assert looked, "fail_vanished_runs never ticked while the run worked"
            # ... and left it to its worker, which ran every step to its own end (its 75 s poll
            # outlives the client's timeout: the run then fails in outage_check, by itself).
            assert INTERRUPTED_TAG not in run.tags
            assert run.tags.get("dagster/failure_reason") in (None, "STEP_FAILURE")
            ends = {e.step_key for e in inst.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)}
            assert "claim_and_poll" in ends and "record_outcomes" in ends
