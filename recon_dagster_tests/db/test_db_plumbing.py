"""URL handling, engines, and the embedded PostgreSQL shared by several processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa

from recon_dagster.db.engine import (
    DatabaseUnavailable,
    InvalidDatabaseUrl,
    dagster_storage_url,
    get_engine,
    normalize_url,
    redact,
    resolve_database_url,
)

# --------------------------------------------------------------------------------------------
# URLs and engines
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given",
    [
        "postgresql://app:pw@db.example:6543/recon",
        "postgres://app:pw@db.example:6543/recon",
        "postgresql+psycopg://app:pw@db.example:6543/recon",
    ],
)
def test_accepted_schemes_normalise_to_psycopg3(given: str) -> None:
    assert normalize_url(given) == "postgresql+psycopg://app:pw@db.example:6543/recon"
    assert dagster_storage_url(given) == "postgresql+psycopg2://app:pw@db.example:6543/recon"


def test_socket_urls_keep_their_host_query() -> None:
    url = "postgresql://postgres:@/recon?host=/srv/pg"
    assert sa.make_url(dagster_storage_url(url)).query == {"host": "/srv/pg"}
    assert sa.make_url(normalize_url(url)).database == "recon"


def test_redact_hides_the_password() -> None:
    assert redact("postgresql://app:hunter2@h:5432/d") == "postgresql://app:***@h:5432/d"
    assert "hunter2" not in redact("postgres://app:hunter2@h/d")


def test_bad_scheme_is_a_clear_error_without_the_secret() -> None:
    with pytest.raises(InvalidDatabaseUrl) as err:
        normalize_url("mysql://app:hunter2@h/d")
    assert "'mysql'" in str(err.value)
    assert "hunter2" not in str(err.value)


def test_resolve_prefers_recon_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECON_DATABASE_URL", "postgres://u@127.0.0.1:5999/x")
    assert resolve_database_url() == "postgresql+psycopg://u@127.0.0.1:5999/x"


def test_engine_is_cached_per_url(database_url: str) -> None:
    assert get_engine(database_url) is get_engine(database_url)
    assert get_engine() is get_engine(database_url)  # the session fixture set RECON_DATABASE_URL
    with get_engine().connect() as conn:
        assert (
            conn.execute(sa.text("SELECT current_database()")).scalar() == sa.make_url(database_url).database
        )


def test_wrong_database_name_is_database_unavailable(database_url: str) -> None:
    url = sa.make_url(database_url).set(database="recon_no_such_db").render_as_string(hide_password=False)
    with pytest.raises(DatabaseUnavailable) as err, get_engine(url).connect():
        pass
    assert "db=recon_no_such_db" in str(err.value)
    assert 'database "recon_no_such_db" does not exist' in str(err.value)


def test_statement_errors_are_not_turned_into_unavailable(engine: sa.Engine) -> None:
    with pytest.raises(sa.exc.ProgrammingError), engine.connect() as conn:
        conn.execute(sa.text("SELECT * FROM no_such_table"))


# --------------------------------------------------------------------------------------------
# The embedded server, on a data folder of its own (not the session's server)
# --------------------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import sys, psycopg
    from recon_dagster.db.embedded import embedded_url, _running_server
    url = embedded_url()
    with psycopg.connect(url) as conn:
        user = conn.execute("SELECT current_user").fetchone()[0]
    print(_running_server().get_pid(), user, url, flush=True)
    if len(sys.argv) > 1:
        sys.stdin.read()  # hold the handle until the parent closes our stdin
    """
)


@pytest.fixture(scope="module")
def pgdata(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # One data folder for the module (initdb takes a second or two); each test starts from a
    # stopped server. A short path: the Unix socket lives in it.
    folder = tmp_path_factory.mktemp("emb") / "pgdata"
    yield folder
    env = {**os.environ, "RECON_EMBEDDED_PGDATA": str(folder)}
    subprocess.run(
        [sys.executable, "-c", "from recon_dagster.db.embedded import stop_embedded; stop_embedded()"],
        env=env,
        check=False,
        timeout=60,
    )


def _child(pgdata: Path, *, hold: bool = False) -> subprocess.Popen[str]:
    env = {**os.environ, "RECON_EMBEDDED_PGDATA": str(pgdata)}
    env.pop("RECON_DATABASE_URL", None)
    args = [sys.executable, "-c", _CHILD] + (["hold"] if hold else [])
    return subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _first_line(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    assert proc.stdout is not None
    pid, user, url = proc.stdout.readline().split()
    return int(pid), user, url


def _postmaster_pid(pgdata: Path) -> int | None:
    pid_file = pgdata / "postmaster.pid"
    return int(pid_file.read_text().splitlines()[0]) if pid_file.exists() else None


@pytest.mark.slow
def test_processes_share_one_server_which_stops_after_the_last(pgdata: Path) -> None:
    holders = [_child(pgdata, hold=True) for _ in range(3)]
    try:
        seen = [_first_line(p) for p in holders]
        assert len({pid for pid, _, _ in seen}) == 1, seen  # one server, not three
        assert {url for _, _, url in seen} == {seen[0][2]}
        assert {user for _, user, _ in seen} == {"postgres"}
        postmaster = psutil.Process(seen[0][0])
        if os.geteuid() == 0:
            assert postmaster.username() == "pgserver"  # never runs as root
        # One holder leaving does not stop the server the others use.
        holders[0].communicate("")
        assert _postmaster_pid(pgdata) == seen[0][0]
    finally:
        for proc in holders:
            proc.communicate("")
    assert _postmaster_pid(pgdata) is None  # the last one out stopped it cleanly
    log = (pgdata / "log").read_text()
    assert "database system is shut down" in log
    assert "PID file" not in log


@pytest.mark.slow
def test_restart_after_the_server_was_killed(pgdata: Path) -> None:
    holder = _child(pgdata, hold=True)
    try:
        first_pid, _, _ = _first_line(holder)
        os.kill(first_pid, signal.SIGKILL)  # postmaster.pid and the socket lock stay behind
        later = _child(pgdata)
        second_pid, user, _ = _first_line(later)
        assert later.wait(timeout=60) == 0
        assert second_pid != first_pid and user == "postgres"
    finally:
        holder.communicate("")


@pytest.mark.slow
def test_stop_embedded_stops_it_for_everyone(pgdata: Path) -> None:
    holder = _child(pgdata, hold=True)
    try:
        pid, _, _ = _first_line(holder)
        env = {**os.environ, "RECON_EMBEDDED_PGDATA": str(pgdata)}
        subprocess.run(
            [sys.executable, "-c", "from recon_dagster.db.embedded import stop_embedded; stop_embedded()"],
            env=env,
            check=True,
            timeout=60,
        )
        assert _postmaster_pid(pgdata) is None
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        holder.communicate("")
    assert holder.returncode == 0  # its exit found nothing left to stop, and said nothing about it


def test_a_forked_child_gets_its_own_connections(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        parent_backend = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the backend it talks to, then leave without cleanup
        try:
            with get_engine(engine.url.render_as_string(hide_password=False)).connect() as conn:
                os.write(write_end, str(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    child_backend = int(os.read(read_end, 100).decode())
    os.waitpid(pid, 0)
    assert child_backend != parent_backend
    # And the parent's pooled connections still work: its backend is alive (the child's exit closed
    # nothing of the parent's) and a checkout answers. Which pooled connection a checkout returns
    # depends on what earlier tests left in the session's pool, so only the parent's backend is named.
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT pg_backend_pid()")).scalar() != child_backend
        alive = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
        assert conn.execute(alive, {"pid": parent_backend}).scalar() == 1


@pytest.mark.slow
def test_a_server_that_never_answers_fails_within_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    from recon_dagster.db import engine as engine_mod

    monkeypatch.setattr(engine_mod, "CONNECT_TIMEOUT_S", 2)  # libpq's minimum
    with socket.socket() as silent:  # the kernel completes the handshake; nobody ever speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        url = f"postgresql://recon:hunter2@127.0.0.1:{port}/recon"
        with pytest.raises(DatabaseUnavailable) as err, get_engine(url).connect():
            pass
    assert f"host=127.0.0.1 port={port} db=recon" in str(err.value)
    assert "timeout" in str(err.value).lower()
    assert "hunter2" not in str(err.value)
