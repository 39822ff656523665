"""Run the real machinery on loopback: the provider sandbox as its own process, a temporary
``DAGSTER_HOME`` on dagster-postgres, and a real ``dagster-daemon`` with its run workers.

Used by the end-to-end daemon tests and ``benchmarks/backlog.py``::

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
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
from psycopg import sql

from recon_dagster.db.engine import dagster_storage_url, libpq_url, parse_url, redact, with_database
from recon_dagster.sandbox import DEFAULT_API_KEY, Scenario

_LISTENING = re.compile(r"sandbox listening on (http://\S+)")


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


def _tail(path: Path, limit: int) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "(no log)"
    return data[-limit:].decode("utf-8", "replace")


def _tree(root: psutil.Process) -> list[psutil.Process]:
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
    for proc in _tree(root):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def _stop_tree(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM the process, wait, then SIGKILL it and every descendant (also ones seen earlier)."""
    if proc.poll() is not None and proc.returncode is not None:
        survivors: list[psutil.Process] = []
    else:
        try:
            survivors = _tree(psutil.Process(proc.pid))
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


def _venv_script(name: str) -> str:
    """A console script of the running interpreter's environment (the venv's dagster-daemon)."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise HarnessError(f"console script {name!r} not found next to {sys.executable} or on PATH")
    return found


# ---------------------------------------------------------------------------------------------
# The sandbox as a process
# ---------------------------------------------------------------------------------------------


def sandbox_env(base_url: str, api_key: str = DEFAULT_API_KEY) -> dict[str, str]:
    """The client environment for a sandbox at ``base_url`` (same names as ``SandboxServer.env()``)."""
    hostport = httpx.URL(base_url).netloc.decode()
    return {
        "KIE_BASE_URL": f"{base_url}/kie",
        "KIE_API_KEY": api_key,
        "REPLICATE_BASE_URL": f"{base_url}/replicate/v1",
        "REPLICATE_API_TOKEN": api_key,
        "ELEVENLABS_BASE_URL": f"{base_url}/elevenlabs",
        "ELEVENLABS_API_KEY": api_key,
        "ANTHROPIC_BASE_URL": f"{base_url}/anthropic",
        "ANTHROPIC_API_KEY": api_key,
        "RECON_MEDIA_ALLOWED_HOSTS": hostport,
    }


@dataclass
class SandboxProcess:
    """A sandbox running in its own process, steered through its admin HTTP API."""

    base_url: str
    env: dict[str, str] = field(repr=False)
    process: subprocess.Popen = field(repr=False)
    log_path: Path
    _admin: httpx.Client = field(repr=False)

    @property
    def admin_url(self) -> str:
        return f"{self.base_url}/_sandbox"

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._admin.request(method, f"/_sandbox/{path}", **kwargs)
        if response.status_code >= 400:
            raise HarnessError(f"sandbox admin {method} {path}: {response.status_code} {response.text[:500]}")
        return response.json()

    def add_task(
        self, kind: str, scenario: Scenario | Mapping[str, Any] | None = None, task_id: str | None = None
    ) -> str:
        """Seed an upstream task (as if a dead worker had created it); returns its id."""
        body: dict[str, Any] = {"kind": kind}
        if scenario is not None:
            body["scenario"] = scenario.to_dict() if isinstance(scenario, Scenario) else dict(scenario)
        if task_id is not None:
            body["task_id"] = task_id
        return str(self._call("POST", "tasks", json=body)["task_id"])

    def add_tasks(
        self, specs: list[tuple[str, Mapping[str, Any] | None, str | None]], *, workers: int = 8
    ) -> list[str]:
        """Seed many tasks ``(kind, scenario dict, task_id)`` over a few keep-alive connections."""

        def seed(chunk: list[tuple[str, Mapping[str, Any] | None, str | None]]) -> list[str]:
            with httpx.Client(base_url=self.base_url, timeout=30) as client:
                out = []
                for kind, scenario, task_id in chunk:
                    body: dict[str, Any] = {"kind": kind, "scenario": scenario, "task_id": task_id}
                    r = client.post("/_sandbox/tasks", json={k: v for k, v in body.items() if v is not None})
                    if r.status_code >= 400:
                        raise HarnessError(f"sandbox refused task {task_id or kind}: {r.text[:300]}")
                    out.append(str(r.json()["task_id"]))
                return out

        chunks = [specs[i::workers] for i in range(workers)]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(seed, chunks))
        # Undo the striping so ids come back in the order of ``specs``.
        ordered: list[str] = [""] * len(specs)
        for w, ids in enumerate(results):
            for j, task_id in enumerate(ids):
                ordered[w + j * workers] = task_id
        return ordered

    def set_default_scenario(self, kind: str, scenario: Scenario | Mapping[str, Any] | None) -> None:
        """Scenario for creates of ``kind`` that carry none (None: plain success)."""
        raw = scenario.to_dict() if isinstance(scenario, Scenario) else scenario
        self._call("POST", "default_scenario", json={"kind": kind, "scenario": raw})

    def stats(self, task_id: str | None = None) -> dict[str, Any]:
        """All counters (and one task's info when ``task_id`` is given)."""
        return self._call("GET", "stats", params={"task_id": task_id} if task_id else None)

    def task_info(self, task_id: str) -> dict[str, Any]:
        """What the sandbox knows of one task (kind, scenario, request counts, media URLs)."""
        return self._call("GET", f"tasks/{task_id}")

    def poll_count(self, task_id: str) -> int:
        """Poll requests seen for ``task_id``."""
        return int(self.stats()["polls"].get(task_id, 0))

    def creates_for(self, contains: str) -> int:
        """Creates that produced ``contains`` or whose body contains it (e.g. a job id)."""
        return int(self._call("GET", "creates", params={"contains": contains})["count"])

    def creates_total(self) -> int:
        """Every create (async task or billable sync call) the sandbox has served."""
        return int(self.stats()["creates_total"])

    def requests(
        self, provider: str | None = None, op: str | None = None, *, window_s: float | None = None
    ) -> dict[str, Any]:
        """Provider API requests seen: ``count``, ``timestamps`` and, given ``window_s``, the
        ``max_in_window`` (the most in any window of that length); ``op`` is read or create."""
        params = {k: v for k, v in (("provider", provider), ("op", op), ("window_s", window_s)) if v}
        return self._call("GET", "requests", params=params)

    def reset(self) -> None:
        """Forget all tasks, default scenarios and counters."""
        self._call("POST", "reset")

    def log_tail(self, limit: int = 4000) -> str:
        return _tail(self.log_path, limit)

    def cpu_seconds(self) -> float:
        """CPU seconds the sandbox process has used so far."""
        return tree_cpu_seconds(self.process.pid)


@contextlib.contextmanager
def sandbox_process(
    port: int = 0,
    latency_s: float = 0.0,
    *,
    api_key: str = DEFAULT_API_KEY,
    log_dir: str | os.PathLike[str] | None = None,
    startup_timeout_s: float = 30.0,
) -> Iterator[SandboxProcess]:
    """``python -m recon_dagster.sandbox`` in its own process; yields once it answers."""
    if latency_s < 0:
        raise ValueError(f"latency_s must be >= 0, got {latency_s!r}")
    owned_dir = None if log_dir is not None else tempfile.mkdtemp(prefix="recon-sandbox-")
    log_path = Path(log_dir or owned_dir or ".") / "sandbox.log"
    cmd = [sys.executable, "-m", "recon_dagster.sandbox", "--port", str(port), "--latency", str(latency_s)]
    if api_key != DEFAULT_API_KEY:
        cmd += ["--api-key", api_key]  # a sandbox key, never a real provider's
    env = dict(os.environ)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    admin: httpx.Client | None = None
    try:

        def listening() -> str | None:
            if proc.poll() is not None:
                raise HarnessError(f"sandbox exited with {proc.returncode}:\n{_tail(log_path, 4000)}")
            match = _LISTENING.search(_tail(log_path, 4000))
            return match.group(1) if match else None

        base_url = wait_for(
            listening,
            timeout_s=startup_timeout_s,
            what="the sandbox to listen",
            interval_s=0.05,
            logs=lambda: _tail(log_path, 4000),
        )
        admin = httpx.Client(base_url=base_url, timeout=30)

        def healthy() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return admin.get("/_sandbox/health").status_code == 200
            return False

        wait_for(healthy, timeout_s=startup_timeout_s, what="the sandbox health check", interval_s=0.05)
        yield SandboxProcess(base_url, sandbox_env(base_url, api_key), proc, log_path, admin)
    finally:
        if admin is not None:
            admin.close()
        _stop_tree(proc, timeout_s=5)
        if owned_dir is not None:
            shutil.rmtree(owned_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# A temporary DAGSTER_HOME on dagster-postgres
# ---------------------------------------------------------------------------------------------


@dataclass
class DagsterHome:
    """A temporary Dagster instance folder: ``dagster.yaml`` + ``workspace.yaml``.

    The storage URL is not in any file: ``env()`` carries it as ``DAGSTER_POSTGRES_URL``.
    """

    path: Path
    storage_url: str = field(repr=False)
    storage_database: str

    @property
    def dagster_yaml(self) -> Path:
        return self.path / "dagster.yaml"

    @property
    def workspace_yaml(self) -> Path:
        return self.path / "workspace.yaml"

    def env(self) -> dict[str, str]:
        """What a process needs to open this instance."""
        return {"DAGSTER_HOME": str(self.path), "DAGSTER_POSTGRES_URL": self.storage_url}

    @contextlib.contextmanager
    def instance(self) -> Iterator[Any]:
        """This instance, opened in the current process (for reading runs from a test)."""
        import dagster as dg

        saved = {k: os.environ.get(k) for k in self.env()}
        os.environ.update(self.env())
        try:
            with dg.DagsterInstance.from_config(str(self.path)) as inst:
                yield inst
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _instance_yaml(
    *,
    max_concurrent_runs: int,
    kind_run_limit: int | None,
    dequeue_interval_s: int,
    dequeue_workers: int,
    sensor_workers: int,
    submit_workers: int,
    monitoring_poll_s: int,
    provider_run_limits: Mapping[str, int] | None = None,
) -> str:
    limits = ""
    if kind_run_limit is not None:
        limits = (
            "  tag_concurrency_limits:\n"
            '    - key: "recon/provider_kind"\n'
            "      value:\n"
            "        applyLimitPerUniqueValue: true\n"
            f"      limit: {kind_run_limit}\n"
        )
    for provider, limit in (provider_run_limits or {}).items():
        if not limits:
            limits = "  tag_concurrency_limits:\n"
        limits += f'    - key: "recon/provider"\n      value: "{provider}"\n      limit: {limit}\n'
    return (
        "# written by recon_dagster_tests.support.harness.dagster_home\n"
        "storage:\n  postgres:\n    postgres_url:\n      env: DAGSTER_POSTGRES_URL\n"
        "run_queue:\n"
        f"  max_concurrent_runs: {max_concurrent_runs}\n"
        "  dequeue_use_threads: true\n"
        f"  dequeue_num_workers: {dequeue_workers}\n"
        f"  dequeue_interval_seconds: {dequeue_interval_s}\n"
        f"{limits}"
        "run_monitoring:\n  enabled: true\n  start_timeout_seconds: 180\n  cancel_timeout_seconds: 180\n"
        f"  max_resume_run_attempts: 0\n  poll_interval_seconds: {monitoring_poll_s}\n"
        "sensors:\n  use_threads: true\n"
        f"  num_workers: {sensor_workers}\n  num_submit_workers: {submit_workers}\n"
        "schedules:\n  use_threads: true\n  num_workers: 1\n"
        "telemetry:\n  enabled: false\n"
    )


def _workspace_yaml(module: str, location: str) -> str:
    return f"load_from:\n  - python_module:\n      module_name: {module}\n      location_name: {location}\n"


def ensure_database(database_url: str, name: str) -> bool:
    """Create database ``name`` on the server of ``database_url`` if missing; True if created."""
    with psycopg.connect(libpq_url(database_url), autocommit=True, connect_timeout=5) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:
            return False  # another process created it between the check and the create
        return True


def drop_database(database_url: str, name: str) -> None:
    """Drop database ``name`` (connections to it are terminated)."""
    with psycopg.connect(libpq_url(database_url), autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.contextmanager
def dagster_home(
    database_url: str,
    *,
    max_concurrent_runs: int = 10,
    kind_run_limit: int | None = 3,
    dequeue_interval_s: int = 1,
    dequeue_workers: int = 4,
    sensor_workers: int = 2,
    submit_workers: int = 4,
    monitoring_poll_s: int = 5,
    storage_database: str | None = None,
    module: str = "recon_dagster.definitions",
    location: str = "recon_dagster",
    keep_storage: bool = False,
    provider_run_limits: Mapping[str, int] | None = None,
) -> Iterator[DagsterHome]:
    """A temp ``DAGSTER_HOME`` whose storage is ``<db>_dagster`` on the same PostgreSQL.

    The storage database is created if missing (and dropped at exit when created here, unless
    ``keep_storage``); its schema is created before this yields, so daemon and test never race to.
    """
    app_db = parse_url(database_url).database
    if not app_db:
        raise ValueError(f"database URL names no database: {redact(database_url)}")
    name = storage_database or f"{app_db}_dagster"
    created = ensure_database(database_url, name)
    storage_url = dagster_storage_url(with_database(database_url, name))
    path = Path(tempfile.mkdtemp(prefix="recon-dagster-home-"))
    home = DagsterHome(path, storage_url, name)
    try:
        home.dagster_yaml.write_text(
            _instance_yaml(
                max_concurrent_runs=max_concurrent_runs,
                kind_run_limit=kind_run_limit,
                dequeue_interval_s=dequeue_interval_s,
                dequeue_workers=dequeue_workers,
                sensor_workers=sensor_workers,
                submit_workers=submit_workers,
                monitoring_poll_s=monitoring_poll_s,
                provider_run_limits=provider_run_limits,
            )
        )
        home.workspace_yaml.write_text(_workspace_yaml(module, location))
        with home.instance():
            pass  # dagster-postgres creates (or upgrades) its schema on open
        yield home
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if created and not keep_storage:
            with contextlib.suppress(psycopg.Error):
                drop_database(database_url, name)


# ---------------------------------------------------------------------------------------------
# The daemon
# ---------------------------------------------------------------------------------------------


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
        return _tail(self.log_path, limit)

    def cpu_seconds(self) -> float:
        """CPU seconds of the daemon, its code server and every run worker so far (reaped included)."""
        return tree_cpu_seconds(self.process.pid)

    def processes(self) -> list[psutil.Process]:
        """The daemon and its live descendants."""
        try:
            return _tree(psutil.Process(self.process.pid))
        except psutil.NoSuchProcess:
            return []


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
    log = Path(log_path) if log_path is not None else home.path / f"daemon-{secrets.token_hex(3)}.log"
    cmd = [_venv_script("dagster-daemon"), "run", "-w", str(home.workspace_yaml)]
    proc = spawn_logged(cmd, log, {**home.env(), **(env or {})}, home.path)
    daemon = DaemonProcess(proc, home, log)
    try:
        time.sleep(0.2)
        if proc.poll() is not None:
            raise HarnessError(f"dagster-daemon exited at once with {proc.returncode}:\n{daemon.log_tail()}")
        yield daemon
    finally:
        _stop_tree(proc, timeout_s=stop_timeout_s)


@dataclass
class DevProcess:
    """A running ``recon-dagster dev`` (webserver + daemon) and the URL it serves."""

    process: subprocess.Popen = field(repr=False)
    url: str
    log_path: Path

    def log_tail(self, limit: int = 6000) -> str:
        return _tail(self.log_path, limit)


@contextlib.contextmanager
def dagster_dev_process(
    home: DagsterHome, env: Mapping[str, str] | None = None, *, port: int, startup_timeout_s: float = 150.0
) -> Iterator[DevProcess]:
    """``recon-dagster dev -- -h 127.0.0.1 -p PORT`` on ``home``; yields once the webserver answers.

    On exit the whole process group (webserver, daemon, code servers, run workers) is stopped.
    """
    full_env = {**os.environ, **home.env(), **(env or {})}
    log = home.path / f"dev-{secrets.token_hex(3)}.log"
    cmd = [_venv_script("recon-dagster"), "dev", "--", "-h", "127.0.0.1", "-p", str(port)]
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
        _stop_tree(proc, timeout_s=5)


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
    "DagsterHome",
    "DaemonProcess",
    "HarnessError",
    "SandboxProcess",
    "dagster_home",
    "daemon_process",
    "dagster_dev_process",
    "drop_database",
    "ensure_database",
    "last_json_line",
    "run_worker_script",
    "sandbox_env",
    "sandbox_process",
    "spawn_logged",
    "tree_cpu_seconds",
    "wait_for",
]
