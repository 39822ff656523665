"""Apply ``migrations/NNN_name.sql`` in numeric order, each once, each in its own transaction.

Applied files are recorded in ``recon_schema_migrations`` with a checksum; an applied file whose
content changed since is an error (never silently re-applied). Concurrent migrators are serialised
with a transaction-level advisory lock, so the second one finds the work done and skips it.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg
import sqlalchemy as sa

from recon_dagster.db.embedded import EmbeddedPostgresError
from recon_dagster.db.engine import (
    DatabaseUnavailable,
    InvalidDatabaseUrl,
    get_engine,
    normalize_url,
    project_root,
    redact,
    resolve_database_url,
)

MIGRATIONS_DIR_NAME = "migrations"
BOOKKEEPING_TABLE = "recon_schema_migrations"
# Arbitrary constant shared by every migrator of this project ("recon" in ASCII).
ADVISORY_LOCK_KEY = 0x7265636F6E

_FILE_RE = re.compile(r"^(\d{3,})_([a-z0-9_]+)\.sql$")

_CREATE_BOOKKEEPING = f"""
CREATE TABLE IF NOT EXISTS {BOOKKEEPING_TABLE} (
  version    int PRIMARY KEY,
  name       text NOT NULL,
  checksum   text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
)
"""


class MigrationError(RuntimeError):
    """A migration could not be applied, or the applied history disagrees with the files."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    sql: str
    checksum: str

    @property
    def filename(self) -> str:
        return self.path.name


def packaged_migrations_dir() -> Path | None:
    """The SQL an installed wheel carries as package data (``recon_dagster/db/migrations/``).

    setup.py copies the top-level ``migrations/`` there at build time; a checkout has no such folder.
    """
    folder = resources.files("recon_dagster.db").joinpath(MIGRATIONS_DIR_NAME)
    # A wheel installed into site-packages is a plain directory; Migration.path needs a real Path.
    return folder if isinstance(folder, Path) and folder.is_dir() else None


def migrations_dir() -> Path:
    """The checkout's top-level ``migrations/`` (editable install), the installed wheel's copy, or the cwd's."""
    root = project_root()
    candidates = [root / MIGRATIONS_DIR_NAME] if root else []
    packaged = packaged_migrations_dir()
    if packaged is not None:
        candidates.append(packaged)
    candidates.append(Path.cwd() / MIGRATIONS_DIR_NAME)
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise MigrationError(
        f"no {MIGRATIONS_DIR_NAME}/ folder found (looked in: {', '.join(str(c) for c in candidates)}); "
        "install recon_dagster from its wheel (which carries the SQL) or run from the checkout"
    )


def discover(directory: Path | None = None) -> list[Migration]:
    """The migration files of ``directory`` (default ``migrations_dir()``), by version."""
    directory = directory or migrations_dir()
    found: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_RE.match(path.name)
        if not match:
            raise MigrationError(f"{path}: migration files are named NNN_lower_snake_name.sql")
        data = path.read_bytes()
        migration = Migration(
            version=int(match.group(1)),
            name=path.stem,
            path=path,
            sql=data.decode("utf-8"),
            checksum=hashlib.sha256(data).hexdigest(),
        )
        if migration.version in found:
            raise MigrationError(
                f"two migrations with version {migration.version}: "
                f"{found[migration.version].filename} and {path.name}"
            )
        found[migration.version] = migration
    return [found[v] for v in sorted(found)]


def _lock(conn: sa.Connection) -> None:
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})


def _applied(conn: sa.Connection) -> dict[int, tuple[str, str]]:
    rows = conn.execute(sa.text(f"SELECT version, name, checksum FROM {BOOKKEEPING_TABLE}"))
    return {version: (name, checksum) for version, name, checksum in rows}


def _check_drift(migrations: list[Migration], applied: dict[int, tuple[str, str]]) -> None:
    drifted = [m for m in migrations if m.version in applied and applied[m.version][1] != m.checksum]
    if drifted:
        details = "; ".join(
            f"{m.filename} (applied sha256 {applied[m.version][1][:12]}, file now {m.checksum[:12]})"
            for m in drifted
        )
        raise MigrationError(
            f"applied migrations were changed after they ran: {details}. "
            "Never edit an applied migration; add a new NNN_*.sql file instead."
        )


# Comments, quoted literals and identifiers, dollar-quoted bodies, or a statement-ending ';'.
_SQL_TOKEN = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\$(\w*)\$.*?\$\1\$|;", re.S)


def split_statements(sql: str) -> list[tuple[int, str]]:
    """The statements of a SQL file with the line each starts on; comment-only pieces are dropped."""
    statements: list[tuple[int, str]] = []
    start = 0
    ends = [m.end() for m in _SQL_TOKEN.finditer(sql) if m.group(0) == ";"]
    for end in [*ends, len(sql)]:
        piece = sql[start:end]
        code = _SQL_TOKEN.sub(lambda m: "" if m.group(0).startswith(("--", "/*")) else m.group(0), piece)
        if code.strip(" \t\r\n;"):
            # The first character that is neither blank nor inside a leading comment.
            lead = re.match(r"(?:\s+|--[^\n]*|/\*.*?\*/)*", piece, re.S)
            offset = start + (lead.end() if lead else 0)
            statements.append((sql.count("\n", 0, offset) + 1, sql[offset:end].strip()))
        start = end
    return statements


def _apply(conn: sa.Connection, migration: Migration) -> None:
    # One statement at a time (all in the file's transaction) so an error names its statement.
    for line, statement in split_statements(migration.sql):
        try:
            conn.exec_driver_sql(statement)
        except sa.exc.DBAPIError as exc:
            diag = getattr(exc.orig, "diag", None)
            message = (diag.message_primary if diag and diag.message_primary else str(exc.orig)).strip()
            if diag and diag.statement_position:
                line += statement.count("\n", 0, int(diag.statement_position) - 1)
            first_line = statement.splitlines()[0][:120]
            raise MigrationError(
                f"migration {migration.filename} failed at line {line} ({first_line}): {message}"
            ) from None
    conn.execute(
        sa.text(f"INSERT INTO {BOOKKEEPING_TABLE} (version, name, checksum) VALUES (:v, :n, :c)"),
        {"v": migration.version, "n": migration.name, "c": migration.checksum},
    )


def migrate(engine: sa.Engine, migrations: list[Migration] | None = None) -> list[str]:
    """Apply the pending ``migrations`` (default: every file in ``migrations/``); return their names."""
    migrations = discover() if migrations is None else sorted(migrations, key=lambda m: m.version)
    with engine.begin() as conn:
        _lock(conn)
        conn.exec_driver_sql(_CREATE_BOOKKEEPING)
        _check_drift(migrations, _applied(conn))

    applied_now: list[str] = []
    for migration in migrations:
        with engine.begin() as conn:
            _lock(conn)
            applied = _applied(conn)
            if migration.version in applied:
                # Another migrator may have applied it while we waited for the lock.
                _check_drift([migration], applied)
                continue
            _apply(conn, migration)
        applied_now.append(migration.name)
    return applied_now


def migrate_command(database_url: str | None) -> int:
    """CLI entry: migrate ``database_url`` (default: resolved URL); print a summary, return exit code."""
    try:
        url = normalize_url(database_url) if database_url else resolve_database_url()
        applied = migrate(get_engine(url))
    except (DatabaseUnavailable, InvalidDatabaseUrl, EmbeddedPostgresError, MigrationError) as exc:
        print(f"migrate: error: {exc}", file=sys.stderr)
        return 1
    except (sa.exc.DBAPIError, psycopg.Error) as exc:
        print(f"migrate: database error on {redact(url)}: {exc}", file=sys.stderr)
        return 1
    if applied:
        print(f"migrate: applied {len(applied)} migration(s) to {redact(url)}: {', '.join(applied)}")
    else:
        print(f"migrate: {redact(url)} is up to date")
    return 0
