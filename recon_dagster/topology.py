"""The production topology on loopback: a gRPC code server, ``dagster-daemon`` and
``dagster-webserver``, each its own process, with a ``workspace.yaml`` that points at the code
server. This is how the Dagster Helm chart deploys a user code location (the code server is the
user deployment; daemon and webserver load nothing but its address)::

    with dagster_home(url) as home, code_server_process(home, env) as server:
        with daemon_process(home, env), webserver_process(home, env) as web:
            ...

Run workers are started by the code server (the default run launcher asks it over gRPC), so they
inherit the code server's environment, as a Kubernetes job would inherit the user deployment's.
Builds on ``recon_dagster.testing``: same log files, same process-tree cleanup.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from recon_dagster.testing import DagsterHome, HarnessError, _stop_tree, _tail, _venv_script, wait_for

LOCATION = "recon_dagster"
MODULE = "recon_dagster.definitions"


def free_port() -> int:
    """A TCP port on loopback nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def grpc_workspace_yaml(host: str, port: int, location: str = LOCATION) -> str:
    """A workspace that loads the code location from a running gRPC server."""
    return f"load_from:\n  - grpc_server:\n      host: {host}\n      port: {port}\n      location_name: {location}\n"


@dataclass
class ServiceProcess:
    """One process of the topology and its log."""

    name: str
    process: subprocess.Popen = field(repr=False)
    log_path: Path
    port: int

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, limit: int = 6000) -> str:
        return _tail(self.log_path, limit)


def _start(
    name: str, cmd: list[str], home: DagsterHome, env: Mapping[str, str] | None, port: int
) -> ServiceProcess:
    log = home.path / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **home.env(), **(env or {})},
            cwd=str(home.path),
            start_new_session=True,
        )
    return ServiceProcess(name, proc, log, port)


@contextlib.contextmanager
def code_server_process(
    home: DagsterHome,
    env: Mapping[str, str] | None = None,
    *,
    port: int | None = None,
    startup_timeout_s: float = 120.0,
) -> Iterator[ServiceProcess]:
    """``dagster code-server start -m recon_dagster.definitions`` on loopback; rewrites the home's
    ``workspace.yaml`` to point at it and yields once it answers gRPC health checks."""
    port = port or free_port()
    cmd = [
        _venv_script("dagster"), "code-server", "start", "-m", MODULE, "--location-name", LOCATION,
        "-h", "127.0.0.1", "-p", str(port),
    ]  # fmt: skip
    server = _start("code-server", cmd, home, env, port)
    try:
        health = [_venv_script("dagster"), "api", "grpc-health-check", "-p", str(port), "-h", "127.0.0.1"]

        def serving() -> bool:
            if not server.alive():
                raise HarnessError(f"the code server exited:\n{server.log_tail()}")
            return subprocess.run(health, capture_output=True, timeout=30).returncode == 0

        wait_for(
            serving,
            timeout_s=startup_timeout_s,
            interval_s=1.0,
            what="the gRPC code server",
            logs=server.log_tail,
        )
        home.workspace_yaml.write_text(grpc_workspace_yaml("127.0.0.1", port))
        yield server
    finally:
        _stop_tree(server.process, timeout_s=20)


@dataclass
class Webserver(ServiceProcess):
    """A running ``dagster-webserver``."""

    def graphql(self, query: str) -> dict[str, Any]:
        response = httpx.post(f"http://127.0.0.1:{self.port}/graphql", json={"query": query}, timeout=30)
        response.raise_for_status()
        return response.json()

    def locations(self) -> dict[str, str]:
        """Code location name -> load status and type, as the UI sees them."""
        data = self.graphql(
            "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
            "locationOrLoadError { __typename } } } } }"
        )
        entries = data["data"]["workspaceOrError"]["locationEntries"]
        return {e["name"]: f"{e['loadStatus']}/{e['locationOrLoadError']['__typename']}" for e in entries}


@contextlib.contextmanager
def webserver_process(
    home: DagsterHome,
    env: Mapping[str, str] | None = None,
    *,
    port: int | None = None,
    startup_timeout_s: float = 120.0,
) -> Iterator[Webserver]:
    """``dagster-webserver -w <workspace.yaml>`` on loopback; yields once ``/server_info`` answers."""
    port = port or free_port()
    cmd = [
        _venv_script("dagster-webserver"),
        "-w",
        str(home.workspace_yaml),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    started = _start("webserver", cmd, home, env, port)
    web = Webserver(started.name, started.process, started.log_path, port)
    try:

        def answering() -> bool:
            if not web.alive():
                raise HarnessError(f"dagster-webserver exited:\n{web.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).status_code == 200
            return False

        wait_for(
            answering,
            timeout_s=startup_timeout_s,
            interval_s=0.5,
            what="dagster-webserver",
            logs=web.log_tail,
        )
        yield web
    finally:
        _stop_tree(web.process, timeout_s=20)


__all__ = [
    "ServiceProcess",
    "Webserver",
    "code_server_process",
    "free_port",
    "grpc_workspace_yaml",
    "webserver_process",
]
