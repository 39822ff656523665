"""The operator's commands, run as a newcomer would: the console script in a subprocess."""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.db import engine as engine_mod
from recon_dagster.db.engine import with_database
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.cli import one_line_failure
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import evaluate_sensor, make_defs


def _cli(
    *args: str, env: dict[str, str] | None = None, cwd: str | None = None, unset: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    full_env.pop("RECON_DEBUG", None) if "RECON_DEBUG" not in (env or {}) else None
    return subprocess.run(
        [sys.executable, "-m", "recon_dagster.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=300,
    )


@pytest.mark.slow
def test_migrate_twice_is_a_no_op(engine, database_url):
    out = _cli("migrate", "--database-url", database_url)
    assert out.returncode == 0, out.stderr
    assert "up to date" in out.stdout


@pytest.mark.slow
def test_status_prints_inflight_and_stale_counts_per_kind(db):
    user = make_user(db)
    make_job(db, user, provider_kind="kie-veo", provider_task_id="t", started_minutes_ago=40)
    make_job(db, user, provider_kind="kie-veo", provider_task_id="u", started_minutes_ago=1)

    out = _cli("status")

    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("kie-veo"))
    assert line.split()[1:3] == ["2", "1"]


@pytest.mark.slow
def test_reconcile_once_recovers_and_prints_the_tick_summary(db, sandbox, tmp_path):
    user = make_user(db)
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=30)
    reserve(db, job, user, 10)

    out = _cli("reconcile", "--once", env={"RECON_MEDIA_DIR": str(tmp_path)}, cwd=str(tmp_path))

    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(
        r"\[reconcile\] scanned=\d+ recovered=1 failed=0 stillRunning=0 errors=0 \(\d+ms\)", out.stdout
    ), out.stdout
    assert job_row(db, job)["status"] == "completed"
    assert "sandbox-key" not in out.stdout + out.stderr


@pytest.mark.slow
def test_reconcile_without_once_explains_itself():
    out = _cli("reconcile")
    assert out.returncode == 2
    assert "--once" in out.stderr


@pytest.mark.slow
def test_unreachable_or_malformed_database_gives_a_clear_one_line_error():
    refused = _cli("status", env={"RECON_DATABASE_URL": "postgresql://root:s3cret@127.0.0.1:1/nope"})
    assert refused.returncode == 1
    assert "database unavailable" in refused.stderr and "port=1" in refused.stderr
    assert "s3cret" not in refused.stderr
    bad = _cli("status", env={"RECON_DATABASE_URL": "mysql://root@127.0.0.1/x"})
    assert bad.returncode == 1
    assert "unsupported database URL scheme 'mysql'" in bad.stderr


def test_sensor_skips_with_a_clear_reason_when_the_database_does_not_answer(monkeypatch, media_dir, sandbox):
    monkeypatch.setenv("RECON_DATABASE_URL", "postgresql://root@127.0.0.1:1/nope")
    engine_mod.dispose_engines()
    try:
        with dg.instance_for_test() as inst:
            result = evaluate_sensor(make_defs(media_dir), inst)
    finally:
        engine_mod.dispose_engines()
    assert result.run_requests == []
    assert "database unavailable" in result.skip_message


# --- failures: one line, what and how to fix, exit codes --------------------------------------------


@pytest.fixture(scope="module")
def unmigrated_url(database_url) -> Iterator[str]:
    """An empty database next to the session's one: reachable, never migrated."""
    from recon_dagster_tests.conftest import _admin_engine, _server_url

    admin = _admin_engine(_server_url())
    name = f"recon_test_empty_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(database_url, name)
    finally:
        engine_mod.dispose_engines()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.mark.parametrize("command", [("status",), ("reconcile", "--once")])
@pytest.mark.slow
def test_an_unmigrated_database_says_run_migrate(unmigrated_url, command):
    out = _cli(*command, env={"RECON_DATABASE_URL": unmigrated_url})
    what, fix = one_line_failure(out, command[0])
    assert re.fullmatch(r"database host=\S+ port=\d+ db=recon_test_empty_\w+ is not migrated \(.+\)", what)
    assert fix == "run `recon-dagster migrate`"
    # the same through --database-url, whatever the environment says
    out = _cli(*command, "--database-url", unmigrated_url, env={"RECON_DATABASE_URL": "not-a-url"})
    assert one_line_failure(out, command[0])[1] == "run `recon-dagster migrate`"


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("not-a-url", "database URL has no scheme (it must start with postgresql://)"),
        ("mysql://root@127.0.0.1/x", "unsupported database URL scheme 'mysql'"),
        ("postgresql://root:pw@127.0.0.1:abc/x", "database URL port 'abc' is not a number"),
        ("postgresql://root:pw@127.0.0.1:99999/x", "database URL port '99999' is out of range"),
    ],
)
@pytest.mark.parametrize("command", [("status",), ("reconcile", "--once"), ("migrate",)])
@pytest.mark.slow
def test_database_url_errors_name_the_bad_part(url, names, command):
    for out in (
        _cli(*command, env={"RECON_DATABASE_URL": url}),
        _cli(*command, "--database-url", url),
    ):
        what, fix = one_line_failure(out, command[0])
        assert what.startswith(names), what
        assert "scheme ''" not in what and "pw" not in out.stderr
        assert (
            fix == "set RECON_DATABASE_URL or --database-url to postgresql://user:password@host:port/dbname"
        )


@pytest.mark.parametrize("command", [("status",), ("reconcile", "--once"), ("migrate",)])
@pytest.mark.slow
def test_an_unreachable_database_is_one_line_with_the_fix(command):
    out = _cli(*command, env={"RECON_DATABASE_URL": "postgresql://root:s3cret@127.0.0.1:1/nope"})
    what, fix = one_line_failure(out, command[0])
    assert what.startswith("database unavailable at host=127.0.0.1 port=1 db=nope: "), what
    assert "s3cret" not in out.stderr
    assert fix == "start PostgreSQL there, or point RECON_DATABASE_URL / --database-url at a running one"


@pytest.mark.slow
def test_database_url_flag_wins_over_the_environment(engine, database_url):
    out = _cli("status", "--database-url", database_url, env={"RECON_DATABASE_URL": "not-a-url"})
    assert out.returncode == 0, out.stderr


def test_every_command_that_touches_the_database_takes_database_url():
    from recon_dagster.cli.commands import build_parser

    parser = build_parser()
    for argv in (["migrate"], ["status"], ["reconcile", "--once"], ["demo"], ["dev"]):
        args = parser.parse_args([*argv, "--database-url", "postgresql://u@h/d"])
        assert args.database_url == "postgresql://u@h/d", argv


@pytest.mark.parametrize(
    ("argv", "command", "what"),
    [
        (("status", "--bogus"), "status", "unrecognized arguments: --bogus"),
        ((), "", "the following arguments are required: command"),
        (
            ("reconcile",),
            "reconcile",
            "--once is required (continuous reconciliation is the Dagster daemon's job)",
        ),
        (("sandbox", "--port", "x"), "sandbox", "argument --port: invalid int value: 'x'"),
    ],
)
@pytest.mark.slow
def test_usage_errors_are_one_line_and_exit_2(argv, command, what):
    out = _cli(*argv)
    if command:
        got_what, fix = one_line_failure(out, command, code=2)
    else:
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        got_what, fix = re.fullmatch(r"recon-dagster: (.+?); (.+)", out.stderr.strip()).groups()  # type: ignore[union-attr]
    assert got_what == what
    assert fix.startswith("see `recon-dagster") or fix.startswith("run `recon-dagster")


@pytest.mark.slow
def test_debug_shows_the_traceback():
    bad = {"RECON_DATABASE_URL": "postgresql://root@127.0.0.1:1/nope"}
    for out in (_cli("--debug", "status", env=bad), _cli("status", "--debug", env=bad),
                _cli("status", env={**bad, "RECON_DEBUG": "1"})):  # fmt: skip
        assert out.returncode == 1
        assert "Traceback" in out.stderr and "DatabaseUnavailable" in out.stderr


@pytest.mark.slow
def test_sandbox_on_a_busy_port_is_one_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = _cli("sandbox", "--port", str(port))
    what, fix = one_line_failure(out, "sandbox")
    assert what.startswith(f"cannot listen on 127.0.0.1:{port}: "), what
    assert fix == "pick another --port"


@pytest.mark.slow
def test_due_jobs_of_a_provider_without_its_key_fail_the_one_shot_in_one_line(db, tmp_path):
    user = make_user(db)
    make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=30)
    make_job(db, user, provider_kind="kie-veo", provider_task_id="t2", started_minutes_ago=30)

    # No provider keys at all: no run is requested for the KIE jobs, and the sweep still runs.
    out = _cli(
        "reconcile", "--once",
        env={"RECON_MEDIA_DIR": str(tmp_path)}, cwd=str(tmp_path),
        unset=("KIE_API_KEY", "REPLICATE_API_TOKEN", "ELEVENLABS_API_KEY", "ANTHROPIC_API_KEY", "DAGSTER_HOME"),
    )  # fmt: skip

    what, fix = one_line_failure(out, "reconcile")
    assert re.fullmatch(
        r"due jobs left in flight, their provider not configured: \d+ of kie \(KIE_API_KEY is not set\)", what
    ), what
    assert int(what.split(": ")[1].split()[0]) >= 2
    assert fix == "set the key (docs/configuration.md) and run `recon-dagster reconcile --once` again"
    assert re.search(r"^\[reconcile\] scanned=\d+ .* runs=1 failedRuns=0$", out.stdout, re.M), out.stdout
    assert "ERROR" not in out.stderr


@pytest.mark.slow
def test_a_provider_outage_is_a_summary_line(db, tmp_path):
    user = make_user(db)
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=30)
    keys = {k: "k" for k in ("KIE_API_KEY", "REPLICATE_API_TOKEN", "ELEVENLABS_API_KEY", "ANTHROPIC_API_KEY")}

    out = _cli(
        "reconcile", "--once", cwd=str(tmp_path), unset=("DAGSTER_HOME",),
        env={**keys, "KIE_BASE_URL": "http://127.0.0.1:1", "RECON_MEDIA_DIR": str(tmp_path)},
    )  # fmt: skip

    # A run whose provider answered none of its jobs fails on purpose (an outage is red in the UI): one line.
    what, fix = one_line_failure(out, "reconcile")
    assert what.startswith(
        "1 of 2 runs failed: reconcile_job (kie-standard): Failure: kie outage: none of the 1 job(s) of this run got an answer"
    )
    assert fix.startswith("the provider is not answering; each job is retried after the cadence")
    assert "errors=1" in out.stdout
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("errors: "))
    assert re.fullmatch(
        r"errors: kie-standard x1: poll failed: .*Connection refused.*; "
        r"each is retried after the cadence \(`recon-dagster status` shows when\)",
        line,
    ), line
    assert job_row(db, job)["status"] == "processing"
    assert "Warning:" not in out.stderr and "site-packages" not in out.stderr


def test_the_cli_filters_the_same_dagster_warnings_as_pytest():
    import tomllib
    from pathlib import Path

    from recon_dagster.cli.commands import DAGSTER_NOISE

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert set(pyproject["tool"]["pytest"]["ini_options"]["filterwarnings"]) == set(DAGSTER_NOISE)


@pytest.mark.slow
def test_status_explains_due_versus_stale_per_kind(db, provider_keys):
    # Keys set: a provider without one adds its own long "not configured" line (tested apart).
    user = make_user(db)
    make_job(db, user, provider_kind="kie-veo", provider_task_id="due", started_minutes_ago=40)
    waiting = make_job(db, user, provider_kind="kie-veo", provider_task_id="w", started_minutes_ago=40)
    leased = make_job(db, user, provider_kind="kie-veo", provider_task_id="l", started_minutes_ago=40)
    make_job(db, user, job_type="pipeline", created_minutes_ago=20)  # no provider call, not swept
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_attempts = 3, reconcile_next_at = now() + interval '4 minutes' "
                "WHERE id = :w"
            ),
            {"w": str(waiting)},
        )
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_attempts = 5, reconcile_lease_owner = 'run', "
                "reconcile_lease_expires_at = now() + interval '10 minutes' WHERE id = :l"
            ),
            {"l": str(leased)},
        )

    out = _cli("status")

    assert out.returncode == 0, out.stderr
    assert all(len(line) <= 100 for line in out.stdout.splitlines()), out.stdout
    veo = next(ln for ln in out.stdout.splitlines() if ln.startswith("kie-veo")).split()
    # inflight stale due leased cadence notsent precall attempts next-attempt
    assert veo[1:9] == ["3", "3", "1", "1", "1", "0", "0", "5/18"], out.stdout
    assert re.fullmatch(r"\d\d:\d\d:\d\d", veo[9]) and re.fullmatch(
        r"\(in [34]m\d\ds\)", " ".join(veo[10:12])
    ), veo
    lines = out.stdout.splitlines()
    at = lines.index("kie-veo: 2 stale, not due:")
    assert re.fullmatch(
        r"  1 leased by a running reconcile run \(lease ends at \S+ UTC, in \dm\d\ds\)", lines[at + 1]
    )
    assert re.fullmatch(
        r"  1 waiting out the reconcile cadence \(next attempt at \S+ UTC, in [34]m\d\ds\)", lines[at + 2]
    ), lines[at + 2]
    none = next(ln for ln in out.stdout.splitlines() if ln.startswith("(none)")).split()
    # A row with no provider call is not stale before the pre-call budget (3 h) is spent.
    assert none[1:8] == ["1", "0", "0", "0", "0", "0", "0"], out.stdout
    assert not any(ln.startswith("(none):") for ln in lines), out.stdout
