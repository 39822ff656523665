"""The migrations runner and the migration files themselves, on a real PostgreSQL."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from recon_dagster.db.engine import DatabaseUnavailable, get_engine, project_root
from recon_dagster.db.migrate import (
    BOOKKEEPING_TABLE,
    MigrationError,
    discover,
    migrate,
    migrations_dir,
)
from recon_dagster.db.migration_sql import MigrationSqlError, split
from recon_dagster_tests.support.migrations import copy_migrations, migrate_command

# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def schema_snapshot(engine: sa.Engine) -> dict[str, list[tuple]]:
    """Columns, indexes and constraints of the public schema, for before/after comparisons."""
    with engine.connect() as conn:
        columns = conn.execute(
            sa.text(
                """
                SELECT table_name, column_name, data_type, is_nullable, column_default
                FROM information_schema.columns WHERE table_schema = current_schema()
                ORDER BY table_name, column_name
                """
            )
        ).all()
        indexes = conn.execute(
            sa.text(
                "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() ORDER BY 2"
            )
        ).all()
        constraints = conn.execute(
            sa.text(
                """
                SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
                FROM pg_constraint WHERE connamespace = current_schema()::regnamespace ORDER BY 1, 2
                """
            )
        ).all()
    return {"columns": list(columns), "indexes": list(indexes), "constraints": list(constraints)}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------------


def test_discover_finds_the_files_in_numeric_order() -> None:
    migrations = discover()
    versions = [m.version for m in migrations]
    assert versions == sorted(versions)
    assert {1, 135, 136} <= set(versions)
    assert all(m.path.parent == migrations_dir() for m in migrations)
    assert migrations_dir() == (project_root() or Path.cwd()) / "migrations"


def test_all_migrations_apply_to_a_fresh_database(fresh_engine: sa.Engine) -> None:
    files = discover()
    applied = migrate(fresh_engine)
    assert applied == [m.name for m in files]
    with fresh_engine.connect() as conn:
        rows = conn.execute(
            sa.text(f"SELECT version, name, checksum FROM {BOOKKEEPING_TABLE} ORDER BY 1")
        ).all()
        tables = set(
            conn.execute(
                sa.text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            ).scalars()
        )
    assert [(r.version, r.name, r.checksum) for r in rows] == [(m.version, m.name, m.checksum) for m in files]
    assert {
        "jobs",
        "usage_logs",
        "user_credits",
        "assets",
        "workflow_executions",
        "credit_anomalies",
        "characters",
    } <= tables


def test_applying_twice_is_a_no_op(fresh_engine: sa.Engine) -> None:
    migrate(fresh_engine)
    before = schema_snapshot(fresh_engine)
    with fresh_engine.connect() as conn:
        stamps = conn.execute(
            sa.text(f"SELECT version, applied_at FROM {BOOKKEEPING_TABLE} ORDER BY 1")
        ).all()
    assert migrate(fresh_engine) == []
    assert schema_snapshot(fresh_engine) == before
    with fresh_engine.connect() as conn:
        assert (
            conn.execute(sa.text(f"SELECT version, applied_at FROM {BOOKKEEPING_TABLE} ORDER BY 1")).all()
            == stamps
        )


def test_135_on_a_jobs_table_that_already_has_its_columns(fresh_engine: sa.Engine) -> None:
    by_version = {m.version: m for m in discover()}
    base, m135 = by_version[1], by_version[135]
    assert migrate(fresh_engine, [base]) == [base.name]
    # As production would be if someone had run the 135 SQL by hand (psql, autocommit) before the
    # runner saw it.
    with fresh_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for st in m135.statements:
            conn.exec_driver_sql(st.text)
    before = schema_snapshot(fresh_engine)
    assert migrate(fresh_engine, [base, m135]) == [m135.name]
    assert schema_snapshot(fresh_engine) == before


@pytest.mark.slow
def test_concurrent_migrators_apply_each_file_once(fresh_engine: sa.Engine) -> None:
    barrier = threading.Barrier(3)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        barrier.wait()
        try:
            results.append(migrate(fresh_engine))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    applied = [name for r in results for name in r]
    assert sorted(applied) == sorted(m.name for m in discover())  # each exactly once overall


def test_checksum_drift_of_an_applied_file_is_an_error(fresh_engine: sa.Engine, tmp_path: Path) -> None:
    folder = copy_migrations(tmp_path / "migrations")
    migrate(fresh_engine, discover(folder))
    target = next(folder.glob("135_*.sql"))
    target.write_text(target.read_text() + "\n-- edited after it was applied\n")
    (folder / "999_later.sql").write_text("CREATE TABLE IF NOT EXISTS later_table (id int);\n")

    with pytest.raises(MigrationError) as err:
        migrate(fresh_engine, discover(folder))
    assert target.name in str(err.value)
    assert "changed after they ran" in str(err.value)
    # Nothing was applied past the drift: the check comes first.
    with fresh_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT to_regclass('later_table')")).scalar() is None


def test_sql_error_names_the_file_line_and_error_and_applies_nothing_of_it(
    fresh_engine: sa.Engine, tmp_path: Path
) -> None:
    # Only tables of its own: the file runs in one transaction, so nothing of it lands.
    folder = copy_migrations(tmp_path / "migrations")
    (folder / "900_broken.sql").write_text(
        "CREATE TABLE IF NOT EXISTS half_done (id int);\n\n-- then a typo\n"
        "CREATE INDEX IF NOT EXISTS half_done_idx ON half_done (no_such_column);\n"
    )
    with pytest.raises(MigrationError) as err:
        migrate(fresh_engine, discover(folder))
    message = str(err.value)
    assert "900_broken.sql" in message
    assert "line 4" in message
    assert 'column "no_such_column" does not exist' in message
    with fresh_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT to_regclass('half_done')")).scalar() is None
        versions = set(conn.execute(sa.text(f"SELECT version FROM {BOOKKEEPING_TABLE}")).scalars())
    assert 900 not in versions
    assert {m.version for m in discover()} <= versions  # the good files before it did land


def test_a_file_stopped_midway_statement_by_statement_resumes(
    fresh_engine: sa.Engine, tmp_path: Path
) -> None:
    # A statement on the app's jobs makes the file run statement by statement: what ran stays, the
    # file is not recorded, and once fixed the next run goes on from there (every statement is
    # idempotent).
    folder = copy_migrations(tmp_path / "migrations")
    broken = folder / "900_broken.sql"
    broken.write_text(
        "SET lock_timeout = '2s';\nALTER TABLE jobs ADD COLUMN IF NOT EXISTS half_col text;\n"
        "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS other_col no_such_type;\n"
    )
    with pytest.raises(MigrationError, match=r"900_broken.sql failed at line 3 .*no_such_type"):
        migrate(fresh_engine, discover(folder))
    with fresh_engine.connect() as conn:
        cols = set(
            conn.execute(
                sa.text(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs' AND table_schema = current_schema()"
                )
            ).scalars()
        )
        assert 900 not in set(conn.execute(sa.text(f"SELECT version FROM {BOOKKEEPING_TABLE}")).scalars())
    assert "half_col" in cols and "other_col" not in cols
    broken.write_text(broken.read_text().replace("no_such_type", "text"))
    assert migrate(fresh_engine, discover(folder)) == ["900_broken"]


def test_badly_named_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "add_things.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="add_things.sql"):
        discover(tmp_path)


def test_unreachable_database_gives_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    port = closed_port()
    url = f"postgresql://recon:s3cret-pw@127.0.0.1:{port}/recon"
    with pytest.raises(DatabaseUnavailable) as err:
        migrate(get_engine(url))
    assert f"127.0.0.1:{port}/recon" in str(err.value)
    assert "s3cret-pw" not in str(err.value)

    assert migrate_command(url) == 1
    stderr = capsys.readouterr().err
    assert f"host=127.0.0.1 port={port}" in stderr and "database unavailable" in stderr
    assert "s3cret-pw" not in stderr


def test_migrate_command_reports_and_succeeds(
    fresh_engine: sa.Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    url = fresh_engine.url.render_as_string(hide_password=False)  # carries the schema (options=)
    assert migrate_command(url) == 0
    assert "135_external_call_reconciliation" in capsys.readouterr().out
    assert migrate_command(url) == 0
    assert "up to date" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# The migration files: their texts, names and lock rules, and what squawk says of them
# --------------------------------------------------------------------------------------------


def _strip_comments_and_strings(sql: str) -> str:
    """SQL with comments and quoted literals blanked, newlines kept (so line numbers stay right)."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    pattern = r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|\$(\w*)\$.*?\$\1\$"
    return re.sub(pattern, blank, sql, flags=re.S)


# ADD [COLUMN] that adds a column (not a constraint), CREATE [UNIQUE] INDEX [CONCURRENTLY], CREATE TABLE.
_NEEDS_IF_NOT_EXISTS = re.compile(
    r"\bADD\s+(?:COLUMN\s+)?(?!CONSTRAINT\b|PRIMARY\b|UNIQUE\b|CHECK\b|FOREIGN\b|EXCLUDE\b|VALUE\b)"
    r"|\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?"
    r"|\bCREATE\s+TABLE\s+",
    re.I,
)


def if_not_exists_violations(sql: str) -> list[str]:
    """The spec's migration-linter rule: every ADD COLUMN / CREATE INDEX / CREATE TABLE says IF NOT EXISTS."""
    code = _strip_comments_and_strings(sql)
    problems = []
    for match in _NEEDS_IF_NOT_EXISTS.finditer(code):
        if not re.match(r"IF\s+NOT\s+EXISTS\b", code[match.end() :], re.I):
            line = code.count("\n", 0, match.start()) + 1
            problems.append(f"line {line}: {' '.join(match.group(0).split())} without IF NOT EXISTS")
    return problems


def lint_directory(folder: Path) -> dict[str, list[str]]:
    return {m.filename: v for m in discover(folder) if (v := if_not_exists_violations(m.sql))}


def test_every_migration_says_if_not_exists() -> None:
    assert lint_directory(migrations_dir()) == {}


def test_linter_rule_catches_a_bad_file(tmp_path: Path) -> None:
    folder = copy_migrations(tmp_path / "migrations")
    (folder / "998_bad.sql").write_text(
        "-- ADD COLUMN in a comment is fine\n"
        "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS ok_col text,\n"
        "  ADD COLUMN bad_col text,\n"
        "  ADD other_bad int,\n"
        "  ADD CONSTRAINT c CHECK (true);\n"
        "CREATE UNIQUE INDEX bad_idx ON jobs (bad_col);\n"
        "CREATE INDEX IF NOT EXISTS good_idx ON jobs (ok_col);\n"
        "SELECT 'CREATE INDEX in a string is fine';\n"
    )
    assert lint_directory(folder) == {
        "998_bad.sql": [
            "line 3: ADD COLUMN without IF NOT EXISTS",
            "line 4: ADD without IF NOT EXISTS",
            "line 6: CREATE UNIQUE INDEX without IF NOT EXISTS",
        ]
    }


def test_135_matches_spec_section_4_in_the_database(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        cols = {
            r.column_name: r
            for r in conn.execute(
                sa.text(
                    """
                    SELECT column_name, data_type, is_nullable, column_default
                    FROM information_schema.columns WHERE table_name = 'jobs'
                      AND column_name IN ('provider_kind', 'provider_task_id', 'provider_call_started_at',
                                          'reconcile_attempts', 'reconcile_last_error')
                    """
                )
            )
        }
        index = conn.execute(
            sa.text(
                """
                SELECT am.amname, ix.indisunique,
                       array(SELECT a.attname FROM unnest(ix.indkey) k
                             JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k) AS columns,
                       pg_get_expr(ix.indpred, ix.indrelid) AS predicate
                FROM pg_index ix
                JOIN pg_class i ON i.oid = ix.indexrelid
                JOIN pg_am am ON am.oid = i.relam
                WHERE i.relname = 'jobs_inflight_idx' AND ix.indrelid = 'jobs'::regclass
                """
            )
        ).one()
    assert {n: (c.data_type, c.is_nullable) for n, c in cols.items()} == {
        "provider_kind": ("text", "YES"),
        "provider_task_id": ("text", "YES"),
        "provider_call_started_at": ("timestamp with time zone", "YES"),
        "reconcile_attempts": ("integer", "NO"),
        "reconcile_last_error": ("text", "YES"),
    }
    assert cols["reconcile_attempts"].column_default == "0"
    assert index.amname == "btree"
    assert not index.indisunique
    assert list(index.columns) == ["provider_call_started_at"]
    assert index.predicate == "(status = ANY (ARRAY['pending'::text, 'processing'::text]))"


# Migration 135 is the app's schema as its design document defines it (section 4). Its first
# shipped text (this digest, after trimming) ran in the field; the file now runs differently (its
# own transactions, CONCURRENTLY, timeouts: docs/deviations.md) and names that text's checksum as
# one it replaces, while creating exactly the same (test_135_matches_spec_section_4_in_the_database,
# test_migration_history.py).
M135_FIRST_SHIPPED_SHA256 = "8de6f22c49980bee77b60635897d685fa212241b5256d0a90617a6d39fd87e24"


def test_135_replaces_its_first_shipped_text() -> None:
    import hashlib

    shipped = Path(__file__).parent / "shipped_migrations" / "135_external_call_reconciliation.sql"
    assert hashlib.sha256(shipped.read_text().strip().encode()).hexdigest() == M135_FIRST_SHIPPED_SHA256
    m135 = next(m for m in discover() if m.version == 135)
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() in m135.replaces


def test_split_respects_quotes_comments_and_dollar_bodies() -> None:
    sql = (
        "-- header; with a semicolon\n"
        "CREATE TABLE IF NOT EXISTS t (v text DEFAULT 'a;b');\n"
        "/* block; comment */\n"
        "CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql AS $fn$ SELECT 1; $fn$;\n"
        "SELECT E'it\\'s; still one string';\n"
        "/* outer /* nested; */ still a comment; */ SELECT 3;\n"
        "SELECT 2"
    )
    assert [(s.line, s.text) for s in split(sql)] == [
        (2, "CREATE TABLE IF NOT EXISTS t (v text DEFAULT 'a;b')"),
        (4, "CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql AS $fn$ SELECT 1; $fn$"),
        (5, "SELECT E'it\\'s; still one string'"),
        (6, "SELECT 3"),
        (7, "SELECT 2"),
    ]


def test_an_escape_string_and_a_nested_comment_run_as_written(
    fresh_engine: sa.Engine, tmp_path: Path
) -> None:
    # The old hand-written splitter cut E'...\'...' at its inner quote and ended a nested comment
    # at its first */, so both statements below failed or ran mangled.
    (tmp_path / "001_tricky.sql").write_text(
        "CREATE TABLE IF NOT EXISTS tricky (v text);\n"
        "/* outer /* inner; */ still comment; */\n"
        "INSERT INTO tricky VALUES (E'it\\'s; one value');\n"
    )
    migrate(fresh_engine, discover(tmp_path))
    with fresh_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT v FROM tricky")).scalars().all() == ["it's; one value"]


def test_a_file_postgresql_cannot_parse_is_named_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "001_bad.sql").write_text("SELECT 1;\n-- two\nCREATE TABL x (a int);\n")
    with pytest.raises(MigrationError, match=r"001_bad.sql does not parse: line 3: syntax error"):
        _ = discover(tmp_path)[0].statements
    with pytest.raises(MigrationSqlError, match="line 3"):
        split("SELECT 1;\n-- two\nCREATE TABL x (a int);\n")


def test_syntax_error_line_points_inside_the_statement(fresh_engine: sa.Engine, tmp_path: Path) -> None:
    # PostgreSQL's parser refuses it before anything runs, naming the line inside the statement.
    (tmp_path / "001_bad.sql").write_text(
        "-- intro\nCREATE TABLE IF NOT EXISTS t (\n  id int,\n  oops oops oops\n);\n"
    )
    with pytest.raises(MigrationError) as err:
        migrate(fresh_engine, discover(tmp_path))
    assert "001_bad.sql does not parse: line 4" in str(err.value)
    assert "syntax error" in str(err.value)
    with fresh_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT to_regclass('t')")).scalar() is None
