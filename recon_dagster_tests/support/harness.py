"""The process harness the end-to-end tests and benchmarks build on: bounded waits, log tails,
CPU accounting and whole-tree shutdown of the processes they start.

The processes themselves live beside it: ``sandbox_process`` (the provider sandbox as its own
process), ``instance`` (a temporary ``DAGSTER_HOME`` on dagster-postgres), ``daemon`` (a real
``dagster-daemon`` and ``recon-dagster dev``) and ``topology`` (the production-shaped stack)::

    with sandbox_process() as sandbox, dagster_home(database_url) as home:
        with daemon_process(home, {**sandbox.env, "RECON_SENSOR_INTERVAL_S": "1"}) as daemon:
            wait_for(lambda: job_is_done(), timeout_s=120, what="job completed", logs=daemon.log_tail)

Every process started here is stopped on exit (SIGTERM, then SIGKILL of its whole process tree).
Logs go to files so a failure message can quote them; secrets are never written to them by us:
the Dagster storage URL (which may carry a password) travels as an environment variable.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil


class HarnessError(RuntimeError):
    """A harness process did not start, or a wait ran out; the message quotes its log."""


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.25,
    logs: Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); bounded by ``timeout_s``.

    On timeout raises ``HarnessError`` naming ``what`` and quoting ``logs()`` (e.g. a daemon's log).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            tail = f"\n--- log tail ---\n{logs()}" if logs is not None else ""
            raise HarnessError(f"timed out after {timeout_s:g} s waiting for {what}{tail}")
        time.sleep(interval_s)


def read_tail(path: Path, limit: int) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "(no log)"
    return data[-limit:].decode("utf-8", "replace")


def process_tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a process and all its descendants, dead ones included.

    Live processes count their own time plus ``children_*`` (the time of descendants they have
    already reaped), so short-lived run workers are not lost between samples.
    """
    total = 0.0
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return 0.0
    for proc in process_tree(root):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def stop_tree(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM the process, wait, then SIGKILL it and every descendant (also ones seen earlier)."""
    if proc.poll() is not None and proc.returncode is not None:
        survivors: list[psutil.Process] = []
    else:
        try:
            survivors = process_tree(psutil.Process(proc.pid))
        except psutil.NoSuchProcess:
            survivors = []
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
    # Descendants that outlived the parent (a run worker mid-run) are killed, never left behind.
    for child in survivors[1:]:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                child.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group we made with start_new_session
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    psutil.wait_procs([p for p in survivors[1:] if p.is_running()], timeout=5)


def venv_script(name: str) -> str:
    """A console script of the running interpreter's environment (the venv's dagster-daemon)."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise HarnessError(f"console script {name!r} not found next to {sys.executable} or on PATH")
    return found


def spawn_logged(cmd: list[str], log: Path, env: Mapping[str, str], cwd: Path) -> subprocess.Popen:
    """``cmd`` in its own session (so its whole tree can be stopped), output to ``log``, with
    ``env`` over this process's environment."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
            cwd=str(cwd),
            start_new_session=True,
        )


def run_worker_script(
    script: str, args: list[str], env: Mapping[str, str], *, timeout_s: float = 60.0
) -> tuple[int, str]:
    """Run a Python ``script`` (source text) in a fresh interpreter; returns (exit code, output)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    return done.returncode, done.stdout + done.stderr


def last_json_line(output: str) -> dict[str, Any]:
    """The last line of ``output`` that parses as a JSON object (a script's result line)."""
    for line in reversed(output.strip().splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    raise HarnessError(f"no JSON result line in output:\n{output[-3000:]}")


__all__ = [
    "HarnessError",
    "last_json_line",
    "process_tree",
    "read_tail",
    "run_worker_script",
    "spawn_logged",
    "stop_tree",
    "tree_cpu_seconds",
    "venv_script",
    "wait_for",
]
