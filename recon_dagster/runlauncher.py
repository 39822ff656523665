"""``PreforkRunLauncher``: Dagster runs started by forking a warm process, not by starting Python.

Dagster's default launcher asks the code server to start each run, and the code server starts a
fresh interpreter for it (multiprocessing ``spawn``): every run imports Dagster, dagster-postgres,
SQLAlchemy, psycopg, httpx and pydantic again before it does anything. On this project's machines
that is 2.5-3 s of CPU per run worker, most of a one-job run's cost and a third of a backlog's.

This launcher keeps one ``forkserver`` beside the daemon with those packages imported once, and
forks each run worker from it. The run then does what ``dagster api execute_run`` does (the
command Dagster's Docker and Kubernetes launchers start): it opens the instance, loads its code
location from the run's origin (this project's own modules are imported fresh by every run, so a
changed code location is never run stale) and executes. Only third-party packages are preloaded;
upgrading them means restarting the daemon, as it already does.

Runs it cannot fork are launched the default way, through the code server: a code server the
workspace names (``grpc_server``: it may run in another container or on another host), a code
location on another Python environment, or a platform without ``forkserver``. Termination and the
run monitor's worker-health check go by the process identity each forked worker records on its
run (host, pid, start time), so they work from the webserver too, on the same host.

Configured in ``dagster.yaml``::

    run_launcher:
      module: recon_dagster.runlauncher
      class: PreforkRunLauncher
      config:
        preload_modules: [dagster, dagster_postgres, sqlalchemy, psycopg, httpx, pydantic]  # e.g.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.launcher import CheckRunHealthResult, DefaultRunLauncher, LaunchRunContext, WorkerStatus
from dagster._serdes import ConfigurableClassData

# Recorded by the forked worker on its run before the run starts: "<host>:<pid>:<start ticks>".
# Hidden (Dagster's "." prefix): it is bookkeeping, not something to filter runs by.
WORKER_TAG = ".dagster/recon-run-worker"

# What every run worker of this project imports before its first op (Dagster and the packages this
# code location's modules import at load); each costs the run nothing once the forkserver has it.
DEFAULT_PRELOAD = (
    "dagster",
    "dagster._cli.api",
    "dagster._core.execution.api",
    "dagster._daemon",
    "dagster._core.storage.local_compute_log_manager",
    "dagster_postgres",
    "psycopg2",
    "sqlalchemy",
    "sqlalchemy.dialects.postgresql",
    "psycopg",
    "httpx",
    "httpcore",  # httpx imports it at its first request, not with httpx
    "pydantic",
    "tenacity",
    "upath",  # Dagster's compute log manager, at a run's first step
)


def worker_identity(pid: int) -> str | None:
    """``host:pid:start-ticks`` of a live process, None when it is gone (or a zombie)."""
    ticks = _start_ticks(pid)
    if ticks is None:
        return None
    return f"{socket.gethostname()}:{pid}:{ticks}"


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc/<pid>/stat field 22): with the pid, it tells
    a worker from a later process that got the same pid. None when there is no such live process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": field 3 (state) onward
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def worker_pid(identity: str) -> int:
    """The pid of a recorded worker identity (``host:pid:start-ticks``)."""
    return int(identity.rsplit(":", 2)[1])


def _worker_alive(identity: str) -> bool | None:
    """True/False for a worker of this host; None when it ran elsewhere (cannot be told here)."""
    host, _pid, ticks = identity.rsplit(":", 2)
    if host != socket.gethostname():
        return None
    return _start_ticks(worker_pid(identity)) == ticks


def _environment(executable: str) -> str:
    """The folder of a Python executable (``.venv/bin``): one folder, one environment."""
    return os.path.dirname(os.path.abspath(executable))


def _run_worker(serialized_instance_ref: str, run_id: str) -> None:
    """The forked run worker: ``dagster api execute_run`` without starting an interpreter."""
    from dagster._cli.api import _execute_run_command_body
    from dagster._core.instance.ref import InstanceRef
    from dagster._serdes import deserialize_value
    from dagster._utils.interrupts import capture_interrupts, setup_interrupt_handlers

    setup_interrupt_handlers()  # SIGTERM (terminate) interrupts the run as SIGINT does
    with capture_interrupts():
        ref = deserialize_value(serialized_instance_ref, InstanceRef)
        with dg.DagsterInstance.from_ref(ref) as instance:
            identity = worker_identity(os.getpid())
            if identity:
                instance.add_run_tags(run_id, {WORKER_TAG: identity})
            _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=False)


class PreforkRunLauncher(DefaultRunLauncher):
    """Launches each run in a process forked from a preloaded ``forkserver`` (see the module doc);
    falls back to the default launcher (the code server) for runs it cannot fork."""

    def __init__(
        self, inst_data: ConfigurableClassData | None = None, preload_modules: Sequence[str] = DEFAULT_PRELOAD
    ) -> None:
        super().__init__(inst_data=inst_data)
        self._preload = list(preload_modules)
        self._lock = threading.Lock()
        self._workers: dict[str, Any] = {}  # run id -> multiprocessing Process (this process's launches)
        self._context: Any = None
        self._instance_ref = ""  # this instance's ref, serialized once for every worker

    @classmethod
    def config_type(cls) -> dict:
        return {
            "preload_modules": dg.Field(
                [str],
                is_required=False,
                default_value=list(DEFAULT_PRELOAD),
                description="Modules the forkserver imports once for every run worker it forks.",
            )
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> PreforkRunLauncher:
        return cls(inst_data=inst_data, preload_modules=config_value.get("preload_modules", DEFAULT_PRELOAD))

    # -- launching ----------------------------------------------------------------------------

    def _forkable(self, run: dg.DagsterRun) -> bool:
        """Whether the run's code location is one this process's workspace starts itself, on this
        process's Python environment.

        A ``grpc_server`` of the workspace is a code server someone else runs, maybe in another
        container or on another host whose interpreter path looks the same: its runs stay with it.
        Environments are compared by the interpreter's folder, symlinks kept: every venv's python
        links to the same base interpreter, so resolved paths would take another venv for this one.
        """
        from dagster._core.remote_origin import (
            InProcessCodeLocationOrigin,
            ManagedGrpcPythonEnvCodeLocationOrigin,
        )

        origin, remote = run.job_code_origin, run.remote_job_origin
        return (
            origin is not None
            and remote is not None
            and isinstance(
                remote.repository_origin.code_location_origin,
                ManagedGrpcPythonEnvCodeLocationOrigin | InProcessCodeLocationOrigin,
            )
            and _environment(origin.executable_path) == _environment(sys.executable)
            and "forkserver" in multiprocessing.get_all_start_methods()
        )

    def _forkserver(self) -> Any:
        if self._context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(self._preload)
            self._instance_ref = dg.serialize_value(self._instance.get_ref())
            self._context = context
        return self._context

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        if not self._forkable(run):
            super().launch_run(context)
            return
        with self._lock:
            self._reap()
            worker = self._forkserver().Process(
                target=_run_worker,
                args=(self._instance_ref, run.run_id),
                name=f"dagster-run-{run.run_id}",
            )
            worker.start()
            self._workers[run.run_id] = worker

    def _reap(self) -> None:
        """Let go of the workers that have exited (each holds a pipe until then)."""
        for run_id, worker in list(self._workers.items()):
            if worker.exitcode is not None:
                worker.join()
                worker.close()
                del self._workers[run_id]

    # -- termination and health ---------------------------------------------------------------

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if not run or run.is_finished:
            return False
        identity = run.tags.get(WORKER_TAG)
        if identity is None:
            return super().terminate(run_id)  # launched through the code server, or not started yet
        self._instance.report_run_canceling(run)
        alive = _worker_alive(identity)
        if alive is None:
            self._instance.report_engine_event(
                f"cannot stop run worker {identity}: it runs on another host than this process "
                f"({socket.gethostname()})",
                run,
                cls=self.__class__,
            )
            return False
        if not alive:
            self._instance.report_run_canceled(run, f"run worker {identity} was no longer running")
            return True
        os.kill(worker_pid(identity), signal.SIGTERM)
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        identity = run.tags.get(WORKER_TAG)
        if identity is None:  # a code-server run: its server reports a worker that dies
            return CheckRunHealthResult(WorkerStatus.RUNNING, "launched through the code server")
        alive = _worker_alive(identity)
        if alive is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"run worker {identity} is on another host")
        if alive:
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=identity)
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"run worker {identity} exited (killed or crashed) before the run finished",
            run_worker_id=identity,
        )

    def join(self, timeout: int = 30) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        super().join(max(1, int(deadline - time.monotonic())))


__all__ = ["DEFAULT_PRELOAD", "WORKER_TAG", "PreforkRunLauncher", "worker_identity", "worker_pid"]
