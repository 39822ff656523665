"""``PreforkRunLauncher`` under the real dagster-daemon: runs forked from the preloaded forkserver
reconcile like the code server's; a killed worker fails its run through the run monitor; a
terminated run is cancelled; runs it cannot fork go through the code server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.storage.tags import GRPC_INFO_TAG

from recon_dagster.core.kinds import get_kind
from recon_dagster.runlauncher import (
    DEFAULT_PRELOAD,
    WORKER_TAG,
    PreforkRunLauncher,
    worker_identity,
    worker_pid,
)
from recon_dagster_tests.support.daemon import daemon_process
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.harness import wait_for
from recon_dagster_tests.support.instance import dagster_home
from recon_dagster_tests.support.reconcile import one
from recon_dagster_tests.support.sandbox_process import sandbox_process


def _stale_jobs(db, sandbox, specs: list[tuple[str, dict]]) -> list:
    user = make_user(db, sub=1000, topup=0)
    jobs = []
    for kind, scenario in specs:
        task = sandbox.add_task(kind, scenario)
        minutes = get_kind(kind).stale_threshold.total_seconds() / 60 + 5
        job = make_job(db, user, provider_kind=kind, provider_task_id=task, started_minutes_ago=minutes)
        reserve(db, job, user, Decimal(2))
        jobs.append(job)
    return jobs


def _env(sandbox, database_url: str, tmp_path: Path) -> dict[str, str]:
    return {
        **sandbox.env,
        "RECON_DATABASE_URL": database_url,
        "RECON_MEDIA_DIR": str(tmp_path / "media"),
        "RECON_SENSOR_INTERVAL_S": "1",
    }


def _in_flight(db, jobs: list) -> int:
    return one(
        db,
        "SELECT count(*) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[])) AND status IN ('pending','processing')",
        ids=[str(j) for j in jobs],
    )


@pytest.mark.daemon
def test_runs_are_forked_from_the_preloaded_forkserver_and_reconcile_their_jobs(
    db, database_url: str, tmp_path: Path
) -> None:
    with sandbox_process(log_dir=tmp_path) as sandbox:
        specs = [
            ("kie-standard", {"outcome": "succeed", "polls_before_done": 0, "media_size": 256}),
            ("kie-standard", {"outcome": "fail", "polls_before_done": 0}),
            ("replicate-prediction", {"outcome": "succeed", "polls_before_done": 0, "media_size": 256}),
        ]
        jobs = _stale_jobs(db, sandbox, specs)
        env = {**_env(sandbox, database_url, tmp_path), "RECON_SINGLE_RUN_BELOW": "1"}
        with (
            dagster_home(database_url, run_launcher="prefork") as home,
            daemon_process(home, env) as daemon,
        ):
            wait_for(
                lambda: _in_flight(db, jobs) == 0,
                timeout_s=180,
                what="the jobs to settle",
                logs=daemon.log_tail,
            )
            with home.instance() as inst:
                assert isinstance(inst.run_launcher, PreforkRunLauncher)
                runs = wait_for(
                    lambda: (
                        [r for r in inst.get_runs() if r.is_finished]
                        if all(r.is_finished for r in inst.get_runs())
                        else []
                    ),
                    timeout_s=60,
                    what="the runs to finish",
                    logs=daemon.log_tail,
                )
                reconcile_runs = [r for r in runs if r.job_name == "reconcile_job"]
                assert reconcile_runs and all(r.status is dg.DagsterRunStatus.SUCCESS for r in reconcile_runs)
                for run in reconcile_runs:
                    host, pid, _ticks = run.tags[WORKER_TAG].rsplit(":", 2)
                    assert host == socket.gethostname()
                    # The engine event Dagster's run worker writes names the same process.
                    started = [
                        e.message
                        for e in inst.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
                        if e.message and e.message.startswith("Started process for run")
                    ]
                    assert started == [f"Started process for run (pid: {pid})."], started
                    # A fork of the daemon's forkserver, not a process of the code server.
                    assert GRPC_INFO_TAG not in run.tags
    statuses = one(
        db,
        "SELECT string_agg(status, ',' ORDER BY status) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[]))",
        ids=[str(j) for j in jobs],
    )
    assert statuses == "completed,completed,failed"


@pytest.mark.daemon
def test_a_killed_forked_worker_fails_its_run_and_a_terminated_one_is_canceled(
    db, database_url: str, tmp_path: Path
) -> None:
    with sandbox_process(log_dir=tmp_path) as sandbox:
        # Each poll answers after 60 s: both runs are still polling when the test acts on them.
        slow = {"outcome": "succeed", "polls_before_done": 0, "media_size": 256, "latency_s": 60}
        jobs = _stale_jobs(db, sandbox, [("kie-standard", slow), ("replicate-prediction", slow)])
        env = _env(sandbox, database_url, tmp_path)
        with (
            dagster_home(database_url, run_launcher="prefork", monitoring_poll_s=2) as home,
            daemon_process(home, env) as daemon,
            home.instance() as inst,
        ):

            def polling() -> list[dg.DagsterRun]:
                runs = [
                    r
                    for r in inst.get_runs(filters=dg.RunsFilter(job_name="reconcile_job"))
                    if r.status is dg.DagsterRunStatus.STARTED and WORKER_TAG in r.tags
                ]
                return runs if len(runs) == 2 else []

            killed, terminated = wait_for(
                polling, timeout_s=180, what="two polling runs", logs=daemon.log_tail
            )
            os.kill(worker_pid(killed.tags[WORKER_TAG]), signal.SIGKILL)
            # What the webserver's Terminate button does: the instance's launcher, in another process.
            assert inst.run_launcher.terminate(terminated.run_id) is True

            def ended(run_id: str) -> dg.DagsterRun | None:
                run = inst.get_run_by_id(run_id)
                return run if run is not None and run.is_finished else None

            dead = wait_for(
                lambda: ended(killed.run_id),
                timeout_s=120,
                what="the killed run to end",
                logs=daemon.log_tail,
            )
            stopped = wait_for(
                lambda: ended(terminated.run_id),
                timeout_s=120,
                what="the terminated run to end",
                logs=daemon.log_tail,
            )
            assert dead.status is dg.DagsterRunStatus.FAILURE
            failure = [
                e.message
                for e in inst.all_logs(killed.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
                if e.message
            ]
            assert any("exited (killed or crashed) before the run finished" in m for m in failure), failure
            assert stopped.status is dg.DagsterRunStatus.CANCELED
            # Neither job was settled by the runs that were stopped.
            assert _in_flight(db, jobs) == 2


def test_worker_identity_tells_a_live_process_from_a_gone_one() -> None:
    me = worker_identity(os.getpid())
    assert me is not None and me.startswith(f"{socket.gethostname()}:{os.getpid()}:")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert worker_identity(child.pid) is None  # exited and reaped


def _run(tags: dict[str, str]) -> dg.DagsterRun:
    return dg.DagsterRun(job_name="reconcile_job", run_id="0" * 8 + "-0000-0000-0000-000000000000", tags=tags)


def test_health_of_a_run_follows_its_recorded_worker() -> None:
    launcher = PreforkRunLauncher()
    alive = launcher.check_run_worker_health(_run({WORKER_TAG: worker_identity(os.getpid()) or ""}))
    assert alive.status is dg._core.launcher.WorkerStatus.RUNNING  # noqa: SLF001
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    identity = worker_identity(child.pid)
    assert identity is not None
    child.kill()
    child.wait()
    gone = launcher.check_run_worker_health(_run({WORKER_TAG: identity}))
    assert gone.status is dg._core.launcher.WorkerStatus.FAILED and "killed or crashed" in (gone.msg or "")  # noqa: SLF001
    # The same pid on a later process (its start time differs) is not the worker.
    host, pid, ticks = (worker_identity(os.getpid()) or "").rsplit(":", 2)
    reused = launcher.check_run_worker_health(_run({WORKER_TAG: f"{host}:{pid}:{int(ticks) + 1}"}))
    assert reused.status is dg._core.launcher.WorkerStatus.FAILED  # noqa: SLF001
    # Elsewhere or unknown: cannot be told here, so never failed from here.
    elsewhere = launcher.check_run_worker_health(_run({WORKER_TAG: f"other-host:{pid}:{ticks}"}))
    assert elsewhere.status is dg._core.launcher.WorkerStatus.RUNNING  # noqa: SLF001
    untagged = launcher.check_run_worker_health(_run({}))
    assert untagged.status is dg._core.launcher.WorkerStatus.RUNNING  # noqa: SLF001


def test_the_launcher_is_configured_from_dagster_yaml(tmp_path: Path) -> None:
    (tmp_path / "dagster.yaml").write_text(
        "run_launcher:\n  module: recon_dagster.runlauncher\n  class: PreforkRunLauncher\n"
        "  config:\n    preload_modules: [dagster, httpx]\n"
    )
    with dg.DagsterInstance.from_config(str(tmp_path)) as inst:
        launcher = inst.run_launcher
        assert isinstance(launcher, PreforkRunLauncher)
        assert launcher._preload == ["dagster", "httpx"]  # noqa: SLF001
    assert PreforkRunLauncher()._preload == list(DEFAULT_PRELOAD)  # noqa: SLF001


def test_the_shipped_dagster_yaml_launches_runs_with_it() -> None:
    shipped = yaml.safe_load((Path(__file__).resolve().parents[2] / "dagster.yaml").read_text())
    launcher = shipped["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("recon_dagster.runlauncher", "PreforkRunLauncher")
    configured = launcher.get("config") or {}
    assert set(configured) <= set(PreforkRunLauncher.config_type())


def _run_from(executable: str, served_by: str = "workspace") -> dg.DagsterRun:
    from dagster._core.code_pointer import ModuleCodePointer
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
    from dagster._core.remote_origin import (
        GrpcServerCodeLocationOrigin,
        ManagedGrpcPythonEnvCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    repository = RepositoryPythonOrigin(
        executable_path=executable, code_pointer=ModuleCodePointer("recon_dagster.definitions", "defs", None)
    )
    location = (
        ManagedGrpcPythonEnvCodeLocationOrigin(
            LoadableTargetOrigin(executable_path=executable, module_name="recon_dagster.definitions"),
            "recon_dagster",
        )
        if served_by == "workspace"
        else GrpcServerCodeLocationOrigin(host="localhost", port=4000, location_name="recon_dagster")
    )
    return dg.DagsterRun(
        job_name="reconcile_job",
        job_code_origin=JobPythonOrigin("reconcile_job", repository),
        remote_job_origin=RemoteJobOrigin(
            RemoteRepositoryOrigin(location, "__repository__"), "reconcile_job"
        ),
    )


def test_only_runs_of_this_python_environment_are_forked(tmp_path: Path) -> None:
    launcher = PreforkRunLauncher()
    here = Path(sys.executable)
    assert launcher._forkable(_run_from(str(here)))  # noqa: SLF001
    assert launcher._forkable(_run_from(str(here.parent / "python3.11")))  # noqa: SLF001 - same venv, other name
    # Another venv whose python links to the very same interpreter is another environment.
    other = tmp_path / "other-venv" / "bin"
    other.mkdir(parents=True)
    (other / "python").symlink_to(os.path.realpath(sys.executable))
    assert not launcher._forkable(_run_from(str(other / "python")))  # noqa: SLF001
    assert not launcher._forkable(dg.DagsterRun(job_name="reconcile_job"))  # noqa: SLF001 - no origin
    # A code server the workspace names (grpc_server) may be another container with the same path.
    assert not launcher._forkable(_run_from(str(here), served_by="grpc_server"))  # noqa: SLF001
