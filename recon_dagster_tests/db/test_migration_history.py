"""The migration files as a DBA reviews them: squawk-clean, every lock on an existing app table
short or non-blocking, and files already shipped fixed without changing what an applied database
holds (their first texts are kept in ``shipped_migrations/``)."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from recon_dagster.db.migrate import (
    BOOKKEEPING_TABLE,
    DEFAULT_LOCK_TIMEOUT,
    MigrationError,
    discover,
    migrate,
    migrations_dir,
)
from recon_dagster_tests.support.migrations import copy_migrations

SHIPPED = Path(__file__).parent / "shipped_migrations"


def squawk_binary() -> str | None:
    here = Path(sys.executable).parent / "squawk"
    return str(here) if here.exists() else shutil.which("squawk")


def run_squawk(*paths: Path) -> subprocess.CompletedProcess[str]:
    binary = squawk_binary()
    if binary is None:
        if os.environ.get("CI") in ("true", "1"):
            pytest.fail("squawk is not installed (the dev extra pins squawk-cli)")
        pytest.skip("squawk is not installed: pip install -e '.[dev]'")
    return subprocess.run(
        [binary, "--reporter", "gcc", *map(str, paths)], capture_output=True, text=True, timeout=120
    )


def test_squawk_finds_nothing_in_migrations() -> None:
    result = run_squawk(*sorted(migrations_dir().glob("*.sql")))
    assert (result.returncode, result.stdout.strip()) == (0, "")


def test_squawk_would_catch_a_blocking_index_on_an_app_table(tmp_path: Path) -> None:
    bad = tmp_path / "900_bad.sql"
    bad.write_text("SET lock_timeout = '2s';\nCREATE INDEX IF NOT EXISTS jobs_bad_idx ON jobs (status);\n")
    result = run_squawk(bad)
    assert result.returncode != 0 and "require-concurrent-index-creation" in result.stdout


def _seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "min": 60, "h": 3600}
    for unit in sorted(units, key=len, reverse=True):
        if value.endswith(unit):
            return float(value[: -len(unit)]) * units[unit]
    return float(value) / 1000  # a bare number is milliseconds


def lock_policy_violations() -> list[str]:
    """Every index on a table that exists before its file is built CONCURRENTLY; every lock that
    queues the app's writes on an existing app table waits at most DEFAULT_LOCK_TIMEOUT."""
    limit = _seconds(DEFAULT_LOCK_TIMEOUT)
    problems = []
    for m in discover():
        lock_timeout = DEFAULT_LOCK_TIMEOUT
        for st in m.statements:
            if (setting := st.setting) and setting[0] == "lock_timeout":
                lock_timeout = setting[1] or DEFAULT_LOCK_TIMEOUT
            existing = [lock for lock in st.locks if not lock.new and lock.table not in m.created_tables]
            if st.index and existing and not st.concurrent:
                problems.append(
                    f"{m.filename} line {st.line}: index on an existing table without CONCURRENTLY"
                )
            blocking = [lock for lock in existing if lock.blocks_app_writes]
            if blocking and not 0 < _seconds(lock_timeout) <= limit:
                problems.append(
                    f"{m.filename} line {st.line}: {blocking[0].mode} on {blocking[0].table} "
                    f"under lock_timeout {lock_timeout}"
                )
    return problems


def test_no_lock_queues_the_apps_writes_for_longer_than_the_lock_timeout() -> None:
    assert lock_policy_violations() == []


def test_every_replaced_checksum_is_a_first_text_kept_here() -> None:
    kept = {hashlib.sha256(p.read_bytes()).hexdigest(): p.name for p in SHIPPED.glob("*.sql")}
    for m in discover():
        for checksum in m.replaces:
            assert kept.get(checksum, "").startswith(f"{m.version:03d}_"), (m.filename, checksum)
    # Every shipped text is either still the file or replaced by it: none is left unaccounted for.
    files = {m.version: m for m in discover()}
    for checksum, name in kept.items():
        assert files[int(name[:3])].accepts(checksum), name


@pytest.fixture
def second_schema(engine: sa.Engine) -> Iterator[sa.Engine]:
    schema = f"recon_mig_{secrets.token_hex(5)}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    scoped = sa.create_engine(engine.url.update_query_dict({"options": f"-c search_path={schema}"}))
    try:
        yield scoped
    finally:
        scoped.dispose()
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')


def apply_as_first_shipped(engine: sa.Engine) -> None:
    """What the runner before this one did with the first texts: each file whole, in one
    transaction, recorded with its checksum."""
    raw = engine.raw_connection()
    try:
        pg = raw.driver_connection
        assert isinstance(pg, psycopg.Connection)
        with pg.transaction():
            pg.execute(
                f"CREATE TABLE {BOOKKEEPING_TABLE} (version int PRIMARY KEY, name text NOT NULL, "
                "checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
        for path in sorted(SHIPPED.glob("*.sql")):
            with pg.transaction():
                pg.execute(path.read_bytes())  # several statements, no parameters: simple protocol
                pg.execute(
                    f"INSERT INTO {BOOKKEEPING_TABLE} (version, name, checksum) VALUES (%s, %s, %s)",
                    [int(path.name[:3]), path.stem, hashlib.sha256(path.read_bytes()).hexdigest()],
                )
    finally:
        raw.close()


def full_schema(engine: sa.Engine) -> dict[str, list[tuple]]:
    with engine.connect() as conn:
        schema = conn.execute(sa.text("SELECT current_schema()")).scalar()
        columns = conn.execute(
            sa.text(
                "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns "
                f"WHERE table_schema = current_schema() AND table_name <> '{BOOKKEEPING_TABLE}' ORDER BY 1, 2"
            )
        ).all()
        indexes = conn.execute(
            sa.text(
                "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                f"AND tablename <> '{BOOKKEEPING_TABLE}' ORDER BY 1, 2"
            )
        ).all()
        constraints = conn.execute(
            sa.text(
                "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE connamespace = current_schema()::regnamespace ORDER BY 1, 2"
            )
        ).all()
        valid = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relnamespace = current_schema()::regnamespace AND NOT i.indisvalid"
            )
        ).scalar()
    strip = f"{schema}."
    out: dict[str, list[tuple]] = {
        name: [tuple(str(v).replace(strip, "") for v in row) for row in rows]
        for name, rows in (("columns", columns), ("indexes", indexes), ("constraints", constraints))
    }
    out["invalid_indexes"] = [(valid,)]
    return out


def test_a_database_the_first_texts_migrated_takes_the_fixed_files_and_ends_the_same(
    fresh_engine: sa.Engine, second_schema: sa.Engine
) -> None:
    apply_as_first_shipped(fresh_engine)
    shipped_versions = {int(p.name[:3]) for p in SHIPPED.glob("*.sql")}

    applied = migrate(fresh_engine)  # no checksum error: every changed file names its first text

    assert applied == [m.name for m in discover() if m.version not in shipped_versions]
    migrate(second_schema)
    assert full_schema(fresh_engine) == full_schema(second_schema)
    with fresh_engine.connect() as conn:  # each row still records the text that ran
        recorded = dict(conn.execute(sa.text(f"SELECT name, checksum FROM {BOOKKEEPING_TABLE}")).all())
    for path in SHIPPED.glob("*.sql"):
        assert recorded[path.stem] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_replaced_file_is_accepted_and_never_run_again(fresh_engine: sa.Engine, tmp_path: Path) -> None:
    folder = copy_migrations(tmp_path / "migrations")
    migrate(fresh_engine, discover(folder))
    target = next(folder.glob("141_*.sql"))
    old = hashlib.sha256(target.read_bytes()).hexdigest()
    # Fixed in how it runs, naming the text that ran: accepted, and not run again (the marker
    # statement would fail if it ran: no such table).
    target.write_text(
        target.read_text() + f"\n-- recon:replaces sha256:{old}\nSELECT * FROM no_such_table;\n"
    )
    assert migrate(fresh_engine, discover(folder)) == []
    # Naming some other text is no licence.
    target.write_text(target.read_text().replace(old, "0" * 64))
    with pytest.raises(MigrationError, match="changed after they ran: 141_reconcile_events_run_id.sql"):
        migrate(fresh_engine, discover(folder))
