"""A real ``dagster-daemon run`` (with its code server and run workers) and ``recon-dagster dev``
(webserver + daemon) on a temporary ``DAGSTER_HOME``, each stopped with its whole process tree."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from recon_dagster import config
from recon_dagster_tests.support.harness import (
    HarnessError,
    process_tree,
    read_tail,
    spawn_logged,
    stop_tree,
    tree_cpu_seconds,
    venv_script,
    wait_for,
)
from recon_dagster_tests.support.instance import DagsterHome
from recon_dagster_tests.support.markers import require_marker


@dataclass
class DaemonProcess:
    """A running ``dagster-daemon run`` and where its log goes."""

    process: subprocess.Popen = field(repr=False)
    home: DagsterHome
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, limit: int = 6000) -> str:
        return read_tail(self.log_path, limit)

    def cpu_seconds(self) -> float:
        """CPU seconds of the daemon, its code server and every run worker so far (reaped included)."""
        return tree_cpu_seconds(self.process.pid)

    def processes(self) -> list[psutil.Process]:
        """The daemon and its live descendants."""
        try:
            return process_tree(psutil.Process(self.process.pid))
        except psutil.NoSuchProcess:
            return []


@contextlib.contextmanager
def daemon_process(
    home: DagsterHome,
    env: Mapping[str, str] | None = None,
    *,
    stop_timeout_s: float = 20.0,
    log_path: str | os.PathLike[str] | None = None,
) -> Iterator[DaemonProcess]:
    """``dagster-daemon run -w <workspace.yaml>`` with ``DAGSTER_HOME`` and ``env`` on top of ours.

    Yields as soon as the process is started (the sensor's first tick follows within seconds).
    On exit: SIGTERM, then SIGKILL after ``stop_timeout_s``, and every descendant is killed.
    """
    require_marker("daemon", "browser", what="a dagster-daemon")
    log = Path(log_path) if log_path is not None else home.path / f"daemon-{secrets.token_hex(3)}.log"
    cmd = [venv_script("dagster-daemon"), "run", "-w", str(home.workspace_yaml)]
    full_env = {**home.env(), **(env or {})}
    # A setting out of range does not stop the daemon: its code server fails to load the
    # definitions, and no run ever starts (a benchmark then waited out its whole timeout).
    try:
        config.validate({**os.environ, **full_env})
    except ValueError as exc:
        raise HarnessError(f"dagster-daemon not started: {exc}") from None
    proc = spawn_logged(cmd, log, full_env, home.path)
    daemon = DaemonProcess(proc, home, log)
    try:
        time.sleep(0.2)
        if proc.poll() is not None:
            raise HarnessError(f"dagster-daemon exited at once with {proc.returncode}:\n{daemon.log_tail()}")
        yield daemon
    finally:
        stop_tree(proc, timeout_s=stop_timeout_s)


@dataclass
class DevProcess:
    """A running ``recon-dagster dev`` (webserver + daemon) and the URL it serves."""

    process: subprocess.Popen = field(repr=False)
    url: str
    log_path: Path

    def log_tail(self, limit: int = 6000) -> str:
        return read_tail(self.log_path, limit)


@contextlib.contextmanager
def dagster_dev_process(
    home: DagsterHome, env: Mapping[str, str] | None = None, *, port: int, startup_timeout_s: float = 150.0
) -> Iterator[DevProcess]:
    """``recon-dagster dev -- -h 127.0.0.1 -p PORT`` on ``home``; yields once the webserver answers.

    On exit the whole process group (webserver, daemon, code servers, run workers) is stopped.
    """
    require_marker("daemon", "browser", what="`recon-dagster dev` (webserver and daemon)")
    full_env = {**os.environ, **home.env(), **(env or {})}
    log = home.path / f"dev-{secrets.token_hex(3)}.log"
    cmd = [venv_script("recon-dagster"), "dev", "--", "-h", "127.0.0.1", "-p", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
            cwd=str(home.path), start_new_session=True,
        )  # fmt: skip
    dev = DevProcess(proc, f"http://127.0.0.1:{port}", log)
    try:

        def answering() -> bool:
            if proc.poll() is not None:
                raise HarnessError(f"recon-dagster dev exited with {proc.returncode}:\n{dev.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{dev.url}/server_info", timeout=2).status_code == 200
            return False

        wait_for(
            answering,
            timeout_s=startup_timeout_s,
            what="the Dagster webserver",
            interval_s=1,
            logs=dev.log_tail,
        )
        yield dev
    finally:
        stop_tree(proc, timeout_s=5)


__all__ = ["DaemonProcess", "DevProcess", "daemon_process", "dagster_dev_process"]
