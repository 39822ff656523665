"""The production topology on loopback: a gRPC code server, ``dagster-daemon`` and
``dagster-webserver``, each its own process, with a ``workspace.yaml`` that points at the code
server. This is how the Dagster Helm chart deploys a user code location (the code server is the
user deployment; daemon and webserver load nothing but its address)::

    with dagster_home(url) as home, code_server_process(home, env) as server:
        with daemon_process(home, env), webserver_process(home, env) as web:
            ...

Run workers are started by the code server (the default run launcher asks it over gRPC), so they
inherit the code server's environment, as a Kubernetes job would inherit the user deployment's.
Builds on ``recon_dagster_tests.support.harness``: same log files, same process-tree cleanup.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from recon_dagster_tests.support.harness import (
    HarnessError,
    read_tail,
    spawn_logged,
    stop_tree,
    venv_script,
    wait_for,
)
from recon_dagster_tests.support.instance import DagsterHome
from recon_dagster_tests.support.markers import require_marker

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
        return read_tail(self.log_path, limit)


@contextlib.contextmanager
def _service(
    name: str,
    cmd: list[str],
    home: DagsterHome,
    env: Mapping[str, str] | None,
    port: int,
    ready: Callable[[ServiceProcess], bool],
    timeout_s: float,
) -> Iterator[ServiceProcess]:
    """Start ``cmd`` logged to ``<home>/<name>.log``; yield once ``ready``; stop its whole tree."""
    env = {**home.env(), **(env or {})}
    service = ServiceProcess(
        name, spawn_logged(cmd, home.path / f"{name}.log", env, home.path), home.path / f"{name}.log", port
    )
    try:

        def up() -> bool:
            if not service.alive():
                raise HarnessError(f"{name} exited:\n{service.log_tail()}")
            return ready(service)

        wait_for(up, timeout_s=timeout_s, interval_s=0.5, what=name, logs=service.log_tail)
        yield service
    finally:
        stop_tree(service.process, timeout_s=20)


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
    require_marker("daemon", what="a Dagster code server")
    port = port or free_port()
    dagster = venv_script("dagster")
    cmd = [
        dagster,
        "code-server",
        "start",
        "-m",
        MODULE,
        "--location-name",
        LOCATION,
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    health = [dagster, "api", "grpc-health-check", "-p", str(port), "-h", "127.0.0.1"]

    def serving(_: ServiceProcess) -> bool:
        return subprocess.run(health, capture_output=True, timeout=30).returncode == 0

    with _service("code-server", cmd, home, env, port, serving, startup_timeout_s) as server:
        home.workspace_yaml.write_text(grpc_workspace_yaml("127.0.0.1", port))
        yield server


def graphql(port: int, query: str) -> dict[str, Any]:
    """One GraphQL query to the webserver on ``port``."""
    response = httpx.post(f"http://127.0.0.1:{port}/graphql", json={"query": query}, timeout=30)
    response.raise_for_status()
    return response.json()


def locations(port: int) -> dict[str, str]:
    """Code location name -> load status and type, as the webserver on ``port`` sees them."""
    data = graphql(
        port,
        "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
        "locationOrLoadError { __typename } } } } }",
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
) -> Iterator[ServiceProcess]:
    """``dagster-webserver -w <workspace.yaml>`` on loopback; yields once ``/server_info`` answers."""
    require_marker("daemon", "browser", what="a Dagster webserver")
    port = port or free_port()
    cmd = [
        venv_script("dagster-webserver"),
        "-w",
        str(home.workspace_yaml),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]

    def answering(_: ServiceProcess) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).status_code == 200
        return False

    with _service("webserver", cmd, home, env, port, answering, startup_timeout_s) as web:
        yield web


__all__ = [
    "ServiceProcess",
    "code_server_process",
    "free_port",
    "graphql",
    "grpc_workspace_yaml",
    "locations",
    "webserver_process",
]
