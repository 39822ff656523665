"""The VM recipes (issue 48, item 6), checked statically: the systemd units pass
``systemd-analyze verify`` (their executables stubbed), start the processes with no shell in between
and stop the whole group, and keep gRPC between the processes off the egress proxy (lowercase
``no_proxy`` and ``no_grpc_proxy`` too); the Docker quick start's compose file puts every service on
one network with a media volume the image's user owns, and the compose file is valid against the
Compose Specification's JSON schema (``check-jsonschema``'s vendored ``compose-spec``, a dev
dependency). ``docker compose config`` runs only where the compose plugin is installed (not here:
the Docker client has none, and Debian 12's ``docker-compose`` 1.29.2 predates the top-level
``name`` key the file uses); the images cannot be built offline."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from recon_dagster.core.paths import project_root
from recon_dagster_tests.support.harness import venv_script

ROOT = project_root() or Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
VENV_BIN = "/opt/recon_dagster/.venv/bin/"


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def test_there_is_a_unit_for_the_code_server_the_daemon_and_the_webserver() -> None:
    assert [p.name for p in UNITS] == [
        "recon-dagster-code.service",
        "recon-dagster-daemon.service",
        "recon-dagster-webserver.service",
    ]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("dagster", "dagster-daemon", "dagster-webserver"):
        stub = stubs / name
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    for unit in UNITS:  # the same text, its executables pointed at the stubs
        (tmp_path / unit.name).write_text(unit.read_text().replace(VENV_BIN, f"{stubs}/"))
    done = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / u.name) for u in UNITS)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_each_unit_runs_its_process_directly_stops_its_group_and_bypasses_the_proxy(path: Path) -> None:
    service = _unit(path)["Service"]
    exec_start = service["ExecStart"].split()
    assert exec_start[0].startswith(VENV_BIN) and "sh" not in Path(exec_start[0]).name
    assert service["KillSignal"] == "SIGTERM" and service["KillMode"] == "mixed"
    # Every Environment= line (systemd adds them up; configparser would keep the last one only).
    env = dict(
        item.split("=", 1)
        for line in path.read_text().splitlines()
        if line.startswith("Environment=")
        for item in line.removeprefix("Environment=").split()
    )
    for name in ("no_proxy", "NO_PROXY", "no_grpc_proxy"):
        assert "127.0.0.1" in env[name].split(","), (path.name, name)


def test_the_vm_workspace_points_at_the_code_servers_unit() -> None:
    code = _unit(ROOT / "deploy" / "systemd" / "recon-dagster-code.service")["Service"]["ExecStart"].split()
    [entry] = yaml.safe_load((ROOT / "deploy" / "systemd" / "workspace.yaml").read_text())["load_from"]
    server = entry["grpc_server"]
    assert code[code.index("-h") + 1] == server["host"] and code[code.index("-p") + 1] == str(server["port"])


def test_the_compose_quick_start_shares_one_network_and_a_media_volume_the_image_owns() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yaml").read_text())
    services = compose["services"]
    assert all(s["networks"] == ["recon"] for s in services.values())
    [host] = [
        e["grpc_server"]["host"]
        for e in yaml.safe_load((ROOT / "deploy" / "workspace.yaml").read_text())["load_from"]
    ]
    assert host in services  # the daemon and webserver reach the code server by its service name
    code = services[host]
    media = code["environment"]["RECON_MEDIA_DIR"]
    assert f"media:{media}" in code["volumes"] and "media" in compose["volumes"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"mkdir -p {media}" in dockerfile and "chown -R dagster" in dockerfile
    for service in services.values():
        assert "recon-dagster-code" in service["environment"]["no_grpc_proxy"].split(",")
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        done = subprocess.run(
            ["docker", "compose", "-f", str(ROOT / "deploy" / "docker-compose.yaml"), "config", "-q"],
            capture_output=True, text=True, cwd=ROOT / "deploy", env={**os.environ},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


def _compose_schema_errors(path: Path) -> str | None:
    """None when ``path`` is valid against the Compose Specification's schema, else the errors."""
    done = subprocess.run(
        [venv_script("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return None if done.returncode == 0 else done.stdout + done.stderr


def test_the_compose_file_is_valid_against_the_compose_specification(tmp_path: Path) -> None:
    compose = ROOT / "deploy" / "docker-compose.yaml"
    assert _compose_schema_errors(compose) is None, _compose_schema_errors(compose)
    # The check is no rubber stamp: a misspelt key, a port as a mapping, a bad depends_on condition.
    text = compose.read_text()
    for good, bad in [
        ("    stop_grace_period: 60s", "    stop_grace_periood: 60s"),
        ('      - "127.0.0.1:3000:3000"', "      - {published: 3000, bogus: 1}"),
        ("service_completed_successfully", "service_done"),
    ]:
        assert good in text
        broken = tmp_path / "docker-compose.yaml"
        broken.write_text(text.replace(good, bad))
        assert _compose_schema_errors(broken) is not None, bad
