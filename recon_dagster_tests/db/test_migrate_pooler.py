"""``migrate`` never runs through a transaction pooler, and holds its settings inside the
transaction that needs them (issue 48, item 2).

Through PgBouncer in transaction mode, migrate's session advisory lock stayed on a server
connection other clients got next (hanging the next migrate), and a statement retried after a
refused lock ran on a server connection without its ``lock_timeout``. Migrate takes its own URL
(``RECON_MIGRATE_DATABASE_URL``, falling back to ``RECON_DATABASE_URL``) and refuses a transaction
pooler with one line, whether the flag says so or it finds one (a real PgBouncer here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from recon_dagster.db import migrate as migrate_module
from recon_dagster.db.migrate import ADVISORY_LOCK_KEY, discover, migrate
from recon_dagster_tests.support.pgbouncer import pgbouncer

needs_pgbouncer = pytest.mark.skipif(
    shutil.which("pgbouncer") is None
    and not Path("/usr/sbin/pgbouncer").exists()
    and os.environ.get("CI") is None,
    reason="needs Debian's pgbouncer (apt-get install pgbouncer; .ci/run installs it)",
)


def _migrate_cli(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recon_dagster.cli", "migrate", "--retry-for", "5"],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _env(**overrides: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RECON_MIGRATE_DATABASE_URL", "RECON_DB_TRANSACTION_POOLER")
    }
    return {**env, **overrides}


def _advisory_locks(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                # This database's only: the other test worker's migrations hold the same key in theirs.
                sa.text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = :k "
                    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                ),
                {"k": ADVISORY_LOCK_KEY & 0xFFFFFFFF},
            ).scalar_one()
        )


@needs_pgbouncer
@pytest.mark.parametrize("flag", ["0", "1"])
def test_migrate_refuses_a_transaction_pooler_in_one_line(
    engine: sa.Engine, database_url: str, tmp_path: Path, flag: str
) -> None:
    with pgbouncer(database_url, pool_size=2) as bouncer:
        done = _migrate_cli(
            _env(RECON_DATABASE_URL=bouncer.url(database_url), RECON_DB_TRANSACTION_POOLER=flag), tmp_path
        )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("recon-dagster migrate: RECON_DATABASE_URL goes through a transaction pooler")
    assert "RECON_MIGRATE_DATABASE_URL" in lines[0]
    assert _advisory_locks(engine) == 0  # nothing left behind on any server connection


@needs_pgbouncer
def test_migrate_takes_its_own_url_beside_the_apps_pooled_one(
    engine: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    with pgbouncer(database_url, pool_size=2) as bouncer:
        done = _migrate_cli(
            _env(
                RECON_DATABASE_URL=bouncer.url(database_url),
                RECON_DB_TRANSACTION_POOLER="1",
                RECON_MIGRATE_DATABASE_URL=database_url,
            ),
            tmp_path,
        )
        bouncer_port = bouncer.port
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is up to date" in done.stdout
    assert f":{bouncer_port}/" not in done.stdout  # PostgreSQL itself, not the app's pooled URL
    assert _advisory_locks(engine) == 0


def test_every_statement_runs_with_the_files_settings_in_its_own_transaction(
    fresh_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A statement run on its own (a file that locks a table existing before it) carries the
    file's ``lock_timeout`` in its transaction, even when the session lost it in between (as on
    another server connection behind a pooler)."""
    with fresh_engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t48_probe (id int)")
        conn.exec_driver_sql("CREATE TABLE t48_seen (lock_timeout text)")
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "900_probe.sql").write_text(
        "SET lock_timeout = '1234ms';\n"
        "ALTER TABLE t48_probe ADD COLUMN IF NOT EXISTS c int;\n"
        "INSERT INTO t48_seen SELECT current_setting('lock_timeout');\n"
    )
    real = migrate_module._execute

    def lands_elsewhere(pg, migration, st):  # the session loses the file's SET right after it
        real(pg, migration, st)
        if st.setting is not None:
            pg.execute("RESET lock_timeout")

    monkeypatch.setattr(migrate_module, "_execute", lands_elsewhere)
    probe = discover(folder)
    assert not probe[0].transactional
    migrate(fresh_engine, probe)
    with fresh_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT lock_timeout FROM t48_seen")).scalars().all() == ["1234ms"]
