"""Apply ``migrations/NNN_name.sql`` in numeric order, each once, without ever stalling the app.

The database is the app's, and ``jobs`` is its hottest table. So:

- **One migrator at a time**: a session advisory lock, polled (a waiting migrator holds no snapshot
  a concurrent index build would wait for).
- **Checksums**: each applied file is recorded in ``recon_schema_migrations`` with its sha256. An
  applied file whose text changed since is an error, unless the new text names the old checksum in
  a ``-- recon:replaces sha256:<hex>`` line: a file fixed in *how* it runs (timeouts, CONCURRENTLY,
  comments) while creating exactly what it did (a test applies every replaced text and compares).
  A replaced file is never run again; its row keeps the checksum of the text that ran.
- **Transactions**: a file runs in one transaction unless it builds an index ``CONCURRENTLY``
  (which cannot run in one) or locks an app table that exists before it (such a lock must be held
  for one statement, not for the file): then each statement is its own transaction, and every
  statement of such a file is idempotent (``IF NOT EXISTS`` / ``IF EXISTS``), so a file stopped
  midway is resumed by the next run.
- **Lock timeouts**: every session starts with ``lock_timeout`` = ``DEFAULT_LOCK_TIMEOUT`` and the
  files ``SET`` their own (short before an ACCESS EXCLUSIVE lock on an app table: the app's writes
  queue behind that wait). A statement or transactional file refused with ``lock_not_available``
  is retried with jittered exponential backoff until ``retry_for_s`` is spent, then migrate stops
  with one line naming the sessions holding the table.
- **No lock for nothing**: an ``ADD COLUMN IF NOT EXISTS`` whose columns all exist, a
  ``DROP CONSTRAINT IF EXISTS`` whose constraints are gone, and a ``CREATE INDEX IF NOT EXISTS``
  whose index exists and is valid are skipped without taking their lock. An INVALID index (left
  by an interrupted concurrent build) is dropped ``CONCURRENTLY`` and built again.
- **The baseline (001)** runs only on a database without the app's tables; elsewhere it is a
  check (``db/baseline.py``) that changes nothing and fails with one line per gap.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TypeVar

import psycopg
import sqlalchemy as sa
from psycopg import errors as pg_errors

from recon_dagster.config import Settings, settings
from recon_dagster.db import baseline
from recon_dagster.db.engine import normalize_url, project_root, resolve_database_url
from recon_dagster.db.migration_sql import MigrationSqlError, Statement, split

MIGRATIONS_DIR_NAME = "migrations"
BOOKKEEPING_TABLE = "recon_schema_migrations"
# Arbitrary constant shared by every migrator of this project ("recon" in ASCII).
ADVISORY_LOCK_KEY = 0x7265636F6E
BASELINE_VERSION = 1

# The session's lock_timeout before each file (a file's own SET overrides it).
DEFAULT_LOCK_TIMEOUT = "2s"
# How long migrate keeps retrying statements refused a lock, in seconds (--retry-for).
DEFAULT_RETRY_FOR_S = 900.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
ADVISORY_POLL_S = 0.5
APPLICATION_NAME = "recon-dagster migrate"

_FILE_RE = re.compile(r"^(\d{3,})_([a-z0-9_]+)\.sql$")
_REPLACES_RE = re.compile(r"^--\s*recon:replaces\s+sha256:([0-9a-f]{64})\s*$", re.M)
_RETRYABLE = (pg_errors.LockNotAvailable, pg_errors.DeadlockDetected)

_CREATE_BOOKKEEPING = f"""
CREATE TABLE IF NOT EXISTS {BOOKKEEPING_TABLE} (
  version    int PRIMARY KEY,
  name       text NOT NULL,
  checksum   text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
)
"""

log = logging.getLogger(__name__)
T = TypeVar("T")


class MigrationError(RuntimeError):
    """A migration could not be applied, or the database disagrees with the files.

    ``details``: lines to show before the one-line error (the baseline's gaps); ``fix``: what to
    do, when it is not "fix the migration named here"."""

    def __init__(self, message: str, *, details: tuple[str, ...] = (), fix: str | None = None) -> None:
        super().__init__(message)
        self.details = details
        self.fix = fix


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    sql: str
    checksum: str
    replaces: frozenset[str] = field(default=frozenset())

    @property
    def filename(self) -> str:
        return self.path.name

    @cached_property
    def statements(self) -> list[Statement]:
        try:
            return split(self.sql)
        except MigrationSqlError as exc:
            raise MigrationError(f"migration {self.filename} does not parse: {exc}") from None

    @cached_property
    def created_tables(self) -> frozenset[str]:
        return frozenset(t for st in self.statements if (t := st.creates_table))

    @cached_property
    def transactional(self) -> bool:
        """One transaction for the file, unless a statement builds CONCURRENTLY or locks a table
        that existed before this file (see the module docstring)."""
        return not any(
            st.concurrent or any(not lock.new and lock.table not in self.created_tables for lock in st.locks)
            for st in self.statements
        )

    def accepts(self, checksum: str) -> bool:
        return checksum == self.checksum or checksum in self.replaces


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
        text = data.decode("utf-8")
        migration = Migration(
            version=int(match.group(1)),
            name=path.stem,
            path=path,
            sql=text,
            checksum=hashlib.sha256(data).hexdigest(),
            replaces=frozenset(_REPLACES_RE.findall(text)),
        )
        if migration.version in found:
            raise MigrationError(
                f"two migrations with version {migration.version}: "
                f"{found[migration.version].filename} and {path.name}"
            )
        found[migration.version] = migration
    return [found[v] for v in sorted(found)]


def check_drift(migrations: list[Migration], applied: dict[int, tuple[str, str]]) -> None:
    drifted = [m for m in migrations if m.version in applied and not m.accepts(applied[m.version][1])]
    if drifted:
        details = "; ".join(
            f"{m.filename} (applied sha256 {applied[m.version][1][:12]}, file now {m.checksum[:12]})"
            for m in drifted
        )
        raise MigrationError(
            f"applied migrations were changed after they ran: {details}. "
            "Never edit an applied migration; add a new NNN_*.sql file instead "
            "(a fix that creates exactly the same names the old text in a `-- recon:replaces sha256:...` line)"
        )


# --- which database, and never through a transaction pooler ------------------------------------------

OWNER_FIX = (
    "run migrate as the role that owns the app's tables (jobs among them), in "
    f"{Settings.migrate_database_url.name} (docs/deploying.md#roles-and-grants), then run "
    "`recon-dagster migrate` again"
)
POOLER_FIX = (
    f"set {Settings.migrate_database_url.name} to PostgreSQL itself (not the pooler; the role that owns "
    "the app's tables), then run `recon-dagster migrate` again"
)


def resolve_migrate_url() -> tuple[str, str]:
    """(URL, the variable it came from): ``RECON_MIGRATE_DATABASE_URL``, else ``RECON_DATABASE_URL``."""
    own = settings().migrate_database_url
    if own:
        return normalize_url(own), Settings.migrate_database_url.name
    return resolve_database_url(), Settings.database_url.name


def refuse_transaction_pooler(engine: sa.Engine, source: str) -> None:
    """One ``MigrationError`` line when ``engine`` goes through a transaction pooler: the flag says
    so of ``RECON_DATABASE_URL``, or two connections of it were served by one server session.

    Behind a pooler in transaction mode the session advisory lock stays on a server connection
    another client gets next (hanging the next migrate), and a statement retried after a refused
    lock may run on a server connection without its ``lock_timeout`` (the app's writes to ``jobs``
    then queue behind it for as long as it waits)."""
    if source == Settings.database_url.name and settings().db_transaction_pooler:
        raise MigrationError(
            f"{source} goes through a transaction pooler ({Settings.db_transaction_pooler.name}=1), where "
            "migrate's advisory lock and lock_timeout would land on other sessions",
            fix=POOLER_FIX,
        )
    shared = shared_server_session(engine)
    if shared is not None:
        raise MigrationError(
            f"{source} goes through a transaction pooler: two connections were served by one server "
            f"session (backend pid {shared}), where migrate's advisory lock and lock_timeout would land "
            "on other sessions",
            fix=POOLER_FIX,
        )


def shared_server_session(engine: sa.Engine, tries: int = 3) -> int | None:
    """The backend pid two distinct connections of ``engine`` both got, or None.

    Directly on PostgreSQL (or through a pooler in session mode) every open connection has its own
    backend, so a shared pid proves a pooler in transaction (or statement) mode. Each connection
    ends its transaction before the other asks, handing the server connection back to such a
    pooler, which gives the most recently freed one out next (PgBouncer's default)."""
    for _ in range(tries):
        # Through the engine's connections, so a failure to connect is its one-line DatabaseUnavailable.
        with engine.connect() as first, engine.connect() as second:
            pids = []
            for conn in (first, second):
                pids.append(int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()))
                conn.rollback()  # back to the pooler before the other connection asks
        if pids[0] == pids[1]:
            return pids[0]
    return None


# --- the session -------------------------------------------------------------------------------------


@contextmanager
def migration_session(engine: sa.Engine) -> Iterator[psycopg.Connection]:
    """A dedicated autocommit connection of ``engine``, closed afterwards (never pooled again: its
    session settings and advisory lock end with it)."""
    with engine.connect() as sa_conn:
        sa_conn = sa_conn.execution_options(isolation_level="AUTOCOMMIT")
        sa_conn.exec_driver_sql("SELECT 1")  # connect now: errors surface as DatabaseUnavailable
        pg = sa_conn.connection.driver_connection
        assert isinstance(pg, psycopg.Connection)
        try:
            yield pg
        finally:
            sa_conn.invalidate()


def reset_session(pg: psycopg.Connection) -> None:
    pg.execute("RESET ALL")
    pg.execute(f"SET lock_timeout = '{DEFAULT_LOCK_TIMEOUT}'")
    pg.execute(f"SET application_name = '{APPLICATION_NAME}'")


def set_local(pg: psycopg.Connection, settings_now: dict[str, str | None]) -> None:
    """Inside a transaction: the settings its statements rely on, ``SET LOCAL`` (they hold on the
    server session that runs the transaction, whatever ran before on it, and end with it)."""
    for name, value in settings_now.items():
        if value is not None:  # None: a RESET, the server's default stands
            pg.execute("SELECT set_config(%s, %s, true)", [name, value])


def applied_versions(pg: psycopg.Connection) -> dict[int, tuple[str, str]] | None:
    """version -> (name, checksum) of the applied files; None when nothing was ever applied."""
    if pg.execute("SELECT to_regclass(%s)", [BOOKKEEPING_TABLE]).fetchone()[0] is None:  # type: ignore[index]  # a SELECT of one function: one row
        return None
    rows = pg.execute(f"SELECT version, name, checksum FROM {BOOKKEEPING_TABLE}").fetchall()
    return {version: (name, checksum) for version, name, checksum in rows}


def _take_advisory_lock(pg: psycopg.Connection, say: Callable[[str], None]) -> None:
    waited = False
    while not pg.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_LOCK_KEY]).fetchone()[0]:  # type: ignore[index]  # a SELECT of one function: one row
        if not waited:
            holder = pg.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND granted LIMIT 1",
                [ADVISORY_LOCK_KEY & 0xFFFFFFFF],
            ).fetchone()
            say(f"waiting for another migrate to finish (backend pid {holder[0] if holder else '?'})")
            waited = True
        time.sleep(ADVISORY_POLL_S)


# --- catalog facts the runner acts on ------------------------------------------------------------------


def index_state(pg: psycopg.Connection, index: str, table: str) -> str | None:
    """'valid', 'invalid' or None (absent) for ``index`` in ``table``'s schema."""
    row = pg.execute(
        """
        SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
        WHERE c.relname = %s AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = to_regclass(%s))
        """,
        [index, table],
    ).fetchone()
    return None if row is None else ("valid" if row[0] else "invalid")


def missing_columns(pg: psycopg.Connection, table: str, columns: tuple[str, ...]) -> list[str]:
    present = {
        r[0]
        for r in pg.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
            [table],
        ).fetchall()
    }
    return [c for c in columns if c not in present]


def present_constraints(pg: psycopg.Connection, table: str, names: tuple[str, ...]) -> list[str]:
    rows = pg.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%s) AND conname = ANY(%s)",
        [table, list(names)],
    ).fetchall()
    return [r[0] for r in rows]


def skip_reason(pg: psycopg.Connection, st: Statement) -> str | None:
    """Why ``st`` would change nothing (and so need not take its lock), or None."""
    if (added := st.added_columns) and not missing_columns(pg, *added):
        return f"every column exists on {added[0]}"
    if (dropped := st.dropped_constraints) and not present_constraints(pg, *dropped):
        return f"no such constraint on {dropped[0]}"
    if (index := st.index) and st.if_not_exists and index_state(pg, *index) == "valid":
        return f"index {index[0]} exists and is valid"
    return None


def blockers(pg: psycopg.Connection, tables: list[str]) -> str:
    """The sessions holding a lock on ``tables``, for the message that gives up."""
    rows = pg.execute(
        """
        SELECT DISTINCT a.pid, a.state, COALESCE(NULLIF(a.application_name, ''), '-'),
               EXTRACT(EPOCH FROM now() - COALESCE(a.xact_start, a.query_start))::int
        FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.granted AND l.relation = ANY(SELECT to_regclass(t) FROM unnest(%s::text[]) t)
          AND a.pid <> pg_backend_pid()
        ORDER BY 4 DESC NULLS LAST LIMIT 5
        """,
        [tables],
    ).fetchall()
    if not rows:
        return "no session holds it now"
    return ", ".join(f"pid {pid} ({state}, {app}, transaction open {age} s)" for pid, state, app, age in rows)


# --- running -------------------------------------------------------------------------------------------


@dataclass
class Runner:
    pg: psycopg.Connection
    retry_for_s: float
    say: Callable[[str], None]
    deadline: float = 0.0
    # The settings the current file relies on (its own SETs over the default lock_timeout), set
    # again inside every transaction that runs one of its statements.
    settings_now: dict[str, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.retry_for_s

    def with_lock_retries(self, what: str, tables: list[str], attempt: Callable[[], T]) -> T:
        """``attempt()``, again after a jittered backoff whenever a lock was refused (lock_timeout)
        or a deadlock chose us, until ``retry_for_s`` is spent."""
        tries = 0
        while True:
            try:
                return attempt()
            except _RETRYABLE as exc:
                tries += 1
                pause = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (tries - 1)) * random.uniform(0.5, 1.0)
                held_by = blockers(self.pg, tables) if tables else ""
                reason = (
                    "deadlock"
                    if isinstance(exc, pg_errors.DeadlockDetected)
                    else "lock not granted within lock_timeout"
                )
                if time.monotonic() + pause > self.deadline:
                    raise MigrationError(
                        f"{what}: {reason} after {tries} tries over {self.retry_for_s:.0f} s"
                        + (f"; held by {held_by}" if held_by else ""),
                        fix="end or wait out the session named here, then run `recon-dagster migrate` again "
                        "(what was applied stays; the rest resumes)",
                    ) from None
                self.say(
                    f"{what}: {reason} (try {tries}); retrying in {pause:.1f} s"
                    + (f"; held by {held_by}" if held_by else "")
                )
                time.sleep(pause)

    def statement(self, migration: Migration, st: Statement) -> None:
        what = f"{migration.filename} line {st.line} ({st.first_line})"
        tables = sorted({lock.table for lock in st.locks if not lock.table.startswith("index ")})
        if st.setting is not None:
            name, value = st.setting
            self.settings_now[name] = value
            _execute(
                self.pg, migration, st
            )  # also for the session: CONCURRENTLY runs outside any transaction
            return
        if skip_reason(self.pg, st) is not None:
            return
        index = st.index
        if index is not None and index_state(self.pg, *index) == "invalid":
            name = index[0]
            self.say(f"{what}: index {name} is INVALID (an interrupted build); dropping it to build again")
            self.with_lock_retries(
                what, tables, lambda: self.pg.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
            )
        try:
            self.with_lock_retries(what, tables, lambda: self._one(migration, st))
        except BaseException:
            if index is not None and st.concurrent:
                self.drop_invalid(*index)
            raise

    def drop_invalid(self, index: str, table: str) -> None:
        """A concurrent build that failed leaves an INVALID index the app's writes still maintain:
        drop it on the way out (best effort; the next run drops it anyway)."""
        try:
            if not self.pg.closed and index_state(self.pg, index, table) == "invalid":
                self.pg.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{index}"')
        except psycopg.Error:
            pass

    def _one(self, migration: Migration, st: Statement) -> None:
        """One statement; in its own transaction with the file's settings, unless it must run
        outside one (CONCURRENTLY: then on this session, where the settings were just made)."""
        if st.concurrent:
            _execute(self.pg, migration, st)
            return
        with self.pg.transaction():
            set_local(self.pg, self.settings_now)
            _execute(self.pg, migration, st)

    def file(self, migration: Migration) -> None:
        reset_session(self.pg)
        self.settings_now = {"lock_timeout": DEFAULT_LOCK_TIMEOUT}
        if migration.transactional:
            tables = sorted({lock.table for st in migration.statements for lock in st.locks})
            self.with_lock_retries(migration.filename, tables, lambda: self._in_one_transaction(migration))
        else:
            for st in migration.statements:
                self.statement(migration, st)
        self.pg.execute(
            f"INSERT INTO {BOOKKEEPING_TABLE} (version, name, checksum) VALUES (%s, %s, %s)",
            [migration.version, migration.name, migration.checksum],
        )

    def _in_one_transaction(self, migration: Migration) -> None:
        with self.pg.transaction():
            set_local(self.pg, {"lock_timeout": DEFAULT_LOCK_TIMEOUT})  # the file's own SETs follow
            for st in migration.statements:
                if st.setting is not None or skip_reason(self.pg, st) is None:
                    _execute(self.pg, migration, st)


def _execute(pg: psycopg.Connection, migration: Migration, st: Statement) -> None:
    try:
        pg.execute(st.text.encode())  # bytes: never read as a query template (no % placeholders)
    except _RETRYABLE:
        raise
    except psycopg.Error as exc:
        diag = exc.diag
        message = (diag.message_primary or str(exc)).strip()
        line = st.line
        if diag.statement_position:
            line += st.text.count("\n", 0, int(diag.statement_position) - 1)
        # A permission refused is the role's, not the migration's: say which role to run it as.
        ours = isinstance(exc, pg_errors.InsufficientPrivilege)
        raise MigrationError(
            f"migration {migration.filename} failed at line {line} ({st.first_line}): {message}",
            fix=OWNER_FIX if ours else None,
        ) from None


def _check_baseline(pg: psycopg.Connection, base: Migration) -> None:
    found = baseline.gaps(pg, baseline.expected_tables(base.statements))
    if found:
        raise MigrationError(
            f"the app's tables lack {len(found)} thing(s) recon_dagster reads or writes (listed above); "
            "nothing was changed",
            details=tuple(found),
            fix="add them through the app's own migrations (docs/deploying.md#when-migrate-reports-a-gap), "
            "then run `recon-dagster migrate` again",
        )


def migrate(
    engine: sa.Engine,
    migrations: list[Migration] | None = None,
    *,
    retry_for_s: float = DEFAULT_RETRY_FOR_S,
    say: Callable[[str], None] | None = None,
    source: str = "the database URL",
) -> list[str]:
    """Apply the pending ``migrations`` (default: every file in ``migrations/``); return their names.

    ``source`` names where the engine's URL came from, for the line refusing a transaction pooler."""
    migrations = discover() if migrations is None else sorted(migrations, key=lambda m: m.version)
    say = say or log.warning
    refuse_transaction_pooler(engine, source)
    with migration_session(engine) as pg:
        reset_session(pg)
        _take_advisory_lock(pg, say)
        try:
            return _apply(pg, migrations, retry_for_s, say)
        finally:
            if not pg.closed and not pg.broken:
                with suppress(psycopg.Error):
                    pg.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_LOCK_KEY])


def _apply(
    pg: psycopg.Connection, migrations: list[Migration], retry_for_s: float, say: Callable[[str], None]
) -> list[str]:
    pg.execute(_CREATE_BOOKKEEPING)
    applied = applied_versions(pg) or {}
    check_drift(migrations, applied)
    runner = Runner(pg, retry_for_s, say)
    base = next((m for m in migrations if m.version == BASELINE_VERSION), None)
    applied_now: list[str] = []
    for migration in migrations:
        if migration.version in applied:
            continue
        if migration.version == BASELINE_VERSION and baseline.present_app_tables(pg):
            _check_baseline(pg, migration)
            pg.execute(
                f"INSERT INTO {BOOKKEEPING_TABLE} (version, name, checksum) VALUES (%s, %s, %s)",
                [migration.version, migration.name, migration.checksum],
            )
        else:
            runner.file(migration)
        applied_now.append(migration.name)
    if base is not None and BASELINE_VERSION in applied:
        _check_baseline(pg, base)  # the app's tables may have changed since
    return applied_now


__all__ = [
    "BOOKKEEPING_TABLE",
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_RETRY_FOR_S",
    "Migration",
    "MigrationError",
    "applied_versions",
    "check_drift",
    "discover",
    "migrate",
    "migrations_dir",
    "skip_reason",
]
