"""The provider sandbox as its own process (``python -m recon_dagster.sandbox``), steered through
its admin HTTP API, as the daemon tests, chaos runs and benchmarks use it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from recon_dagster.config import Settings
from recon_dagster.sandbox import DEFAULT_API_KEY, Scenario, plugins
from recon_dagster_tests.support.harness import HarnessError, read_tail, stop_tree, tree_cpu_seconds, wait_for

_LISTENING = re.compile(r"sandbox listening on (http://\S+)")


def sandbox_env(base_url: str, api_key: str = DEFAULT_API_KEY) -> dict[str, str]:
    """The client environment for a sandbox at ``base_url``: what ``SandboxServer.env()`` gives, for
    every registered provider's plugin."""
    hostport = httpx.URL(base_url).netloc.decode()
    return {
        **{
            var: value
            for name, plugin in plugins.plugins().items()
            for var, value in plugin.env(f"{base_url}/{name}", api_key).items()
        },
        Settings.media_allowed_hosts.name: hostport,
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
        return read_tail(self.log_path, limit)

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
                raise HarnessError(f"sandbox exited with {proc.returncode}:\n{read_tail(log_path, 4000)}")
            match = _LISTENING.search(read_tail(log_path, 4000))
            return match.group(1) if match else None

        base_url = wait_for(
            listening,
            timeout_s=startup_timeout_s,
            what="the sandbox to listen",
            interval_s=0.05,
            logs=lambda: read_tail(log_path, 4000),
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
        stop_tree(proc, timeout_s=5)
        if owned_dir is not None:
            shutil.rmtree(owned_dir, ignore_errors=True)


__all__ = ["SandboxProcess", "sandbox_env", "sandbox_process"]
