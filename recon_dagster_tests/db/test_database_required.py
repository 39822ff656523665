"""A deployment that forgot ``RECON_DATABASE_URL`` fails at once, with one line naming it, and never
starts the embedded PostgreSQL: the code server refuses the definitions and exits, the CLI's
database commands exit 1, the worker library raises. Only the demo, ``recon-dagster dev``, the
tests and ``RECON_EMBEDDED_POSTGRES=1`` start it.

Each case runs with a data folder of its own for the embedded server (``RECON_EMBEDDED_PGDATA``),
so "no server started" is "that folder was never created"."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recon_dagster.cli.commands import build_parser
from recon_dagster.db import engine as engine_mod
from recon_dagster.db.embedded import PGDATA_ENV
from recon_dagster.db.engine import DATABASE_URL_ENV, EMBEDDED_ENV, DatabaseNotConfigured
from recon_dagster_tests.support.cli import one_line_failure
from recon_dagster_tests.support.topology import free_port

MISSING = "RECON_DATABASE_URL is not set"


def _deployment_env(tmp_path: Path) -> dict[str, str]:
    """This process's environment as a deployment's that forgot the one secret: no URL, no opt-in."""
    env = {k: v for k, v in os.environ.items() if k not in (DATABASE_URL_ENV, EMBEDDED_ENV, "RECON_DEBUG")}
    env[PGDATA_ENV] = str(tmp_path / "pgdata")
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env["DAGSTER_HOME"] = str(home)
    return env


def _no_server_started(tmp_path: Path) -> None:
    assert not (tmp_path / "pgdata").exists(), "the embedded PostgreSQL was started"


@pytest.mark.slow
def test_the_code_server_refuses_to_load_and_exits(tmp_path: Path) -> None:
    # The Dockerfile's command. Before: it loaded, served, and its sensor started a private server.
    env = _deployment_env(tmp_path)
    cmd = [sys.executable, "-m", "dagster", "api", "grpc", "-m", "recon_dagster.definitions",
           "-h", "127.0.0.1", "-p", str(free_port())]  # fmt: skip
    server = subprocess.Popen(
        cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _, stderr = server.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        server.kill()
        server.communicate()
        pytest.fail("the code server started without RECON_DATABASE_URL")
    assert server.returncode != 0
    assert f"DatabaseNotConfigured: {MISSING}: point it at the app's PostgreSQL" in stderr, stderr[-2000:]
    _no_server_started(tmp_path)


@pytest.mark.slow
def test_loading_the_definitions_fails_with_one_line_naming_the_variable(tmp_path: Path) -> None:
    # What every run worker does first, and `dg check defs`.
    done = subprocess.run(
        [sys.executable, "-c", "import recon_dagster.definitions"],
        env=_deployment_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"recon_dagster.db.engine.DatabaseNotConfigured: {MISSING}: "), done.stderr[-2000:]
    assert "RECON_EMBEDDED_POSTGRES=1" in last
    _no_server_started(tmp_path)


@pytest.mark.parametrize(
    "command",
    [
        ("reconcile", "--once"),
        ("status",),
        ("migrate",),
        ("plan", "--no-poll"),
        ("explain", "00000000-0000-0000-0000-000000000000"),
    ],
)
@pytest.mark.slow
def test_database_commands_exit_1_with_one_line(tmp_path: Path, command: tuple[str, ...]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "recon_dagster.cli", *command],
        env=_deployment_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    what, fix = one_line_failure(done, command[0])
    assert what == MISSING
    assert fix.startswith("set RECON_DATABASE_URL or --database-url to postgresql://")
    _no_server_started(tmp_path)


def test_the_worker_library_raises_instead_of_starting_a_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    monkeypatch.delenv(EMBEDDED_ENV, raising=False)
    monkeypatch.setenv(PGDATA_ENV, str(tmp_path / "pgdata"))
    from recon_dagster.worker import providers_from_env

    with pytest.raises(DatabaseNotConfigured, match=MISSING):
        engine_mod.get_engine()
    with pytest.raises(DatabaseNotConfigured):
        engine_mod.resolve_database_url()
    providers_from_env()  # building clients touches no database; their first budgeted call would raise
    _no_server_started(tmp_path)


@pytest.mark.slow
def test_a_bad_opt_in_value_is_named(tmp_path: Path) -> None:
    env = {**_deployment_env(tmp_path), EMBEDDED_ENV: "maybe"}
    done = subprocess.run(
        [sys.executable, "-m", "recon_dagster.cli", "status"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )  # fmt: skip
    what, _ = one_line_failure(done, "status")
    assert what == "RECON_EMBEDDED_POSTGRES must be 1 or 0, got 'maybe'"
    _no_server_started(tmp_path)


def test_only_the_demo_and_dev_start_the_embedded_server_by_themselves() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    embedded = {name for name, p in sub.choices.items() if p.get_default("embedded_database")}  # type: ignore[attr-defined]
    assert embedded == {"demo", "dev"}


@pytest.mark.slow
def test_dev_opts_in_by_itself(tmp_path: Path) -> None:
    # `recon-dagster dev` with no URL and no opt-in: the embedded server (a folder of its own here),
    # migrated, and handed to `dagster dev` (here only its --help, so nothing keeps running).
    env = _deployment_env(tmp_path)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "recon_dagster.cli", "dev", "--", "--help"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Usage:" in done.stdout and "dagster dev" in done.stdout
    assert (tmp_path / "pgdata" / "PG_VERSION").exists()
    # The last user out stopped it.
    deadline = started + 300
    while (tmp_path / "pgdata" / "postmaster.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (tmp_path / "pgdata" / "postmaster.pid").exists()
