"""Database URLs and SQLAlchemy engines for our own database layer (psycopg 3).

One engine per URL per process, created lazily. A database that does not answer fails fast with
``DatabaseUnavailable``, whose message names host, port and database but never the password.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection

from recon_dagster.config import Settings, settings
from recon_dagster.core.paths import project_root
from recon_dagster.db.budget import OTHER_PROCESS_CONNECTIONS
from recon_dagster.db.schema_contract import check_dbapi

# project_root is passed on from core.paths (the migrations and the instance find the tree here).
__all__ = ["project_root"]

DATABASE_URL_ENV = Settings.database_url.name
EMBEDDED_ENV = Settings.embedded_postgres.name
CONNECT_TIMEOUT_S = 5
# A pooled connection idle longer than this is pinged before it is handed out (one round trip);
# one returned more recently is handed out as it is (see ``_ping_if_idle``).
PING_AFTER_IDLE_S = 1.0
_RETURNED_AT = "recon_returned_at"

# Schemes we accept for RECON_DATABASE_URL, all meaning "PostgreSQL".
_ACCEPTED_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")


class InvalidDatabaseUrl(ValueError):
    """A database URL we cannot use (wrong scheme, unparseable)."""


class DatabaseNotConfigured(ValueError):
    """No ``RECON_DATABASE_URL``, and the embedded development server was not asked for."""

    def __init__(self) -> None:
        super().__init__(
            f"{DATABASE_URL_ENV} is not set: point it at the app's PostgreSQL "
            "(postgresql://user:password@host:port/dbname); the embedded development server starts only "
            f"for `recon-dagster demo` / `dev`, the tests, or with {EMBEDDED_ENV}=1"
        )


class DatabaseUnavailable(RuntimeError):
    """The database did not answer (refused, timed out, unknown host or database, auth failed);
    ``kind`` names which (``connect_failure_kind``)."""

    def __init__(self, url: str, reason: str, kind: str = "unreachable") -> None:
        super().__init__(f"database unavailable at {redact(url)}: {reason}")
        self.url = redact(url)
        self.reason = reason
        self.kind = kind


# What a failed connect means, from the server's or libpq's first line (connect errors carry no
# SQLSTATE in psycopg): the first pattern that matches names it; anything else is "unreachable".
_CONNECT_FAILURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("too many connections", ("too many connections", "too many clients", "remaining connection slots")),
    (
        "authentication failed",
        (
            "authentication failed",
            "no pg_hba.conf entry",
            'role "',
            "password is required",
            "permission denied",
        ),
    ),
    ("database does not exist", ('database "',)),
)


def connect_failure_kind(text: str) -> str:
    """``too many connections``, ``authentication failed``, ``database does not exist`` or
    ``unreachable`` (refused, timed out, unknown host) for a failed connect's message."""
    lowered = text.lower()
    for kind, needles in _CONNECT_FAILURES:
        if any(n in lowered for n in needles):
            return kind
    return "unreachable"


# SQLSTATEs of a statement that ran out of time: named so, not "unexpected".
STATEMENT_TIMEOUTS = {"57014": "statement timeout", "55P03": "lock timeout"}


def parse_url(url: str) -> URL:
    """A PostgreSQL URL as SQLAlchemy parses it; InvalidDatabaseUrl (never echoing it) otherwise."""
    # Messages name the bad part, never the URL itself: it may carry a password.
    if "://" not in url:
        raise InvalidDatabaseUrl("database URL has no scheme (it must start with postgresql://)")
    scheme = url.split("://", 1)[0]
    if scheme not in _ACCEPTED_SCHEMES:
        raise InvalidDatabaseUrl(
            f"unsupported database URL scheme {scheme!r} (accepted: {', '.join(_ACCEPTED_SCHEMES)})"
        )
    port = _port_part(url)
    if port is not None and not port.isdigit():
        raise InvalidDatabaseUrl(f"database URL port {port!r} is not a number")
    if port and not 0 < int(port) < 65536:
        raise InvalidDatabaseUrl(f"database URL port {port!r} is out of range (1-65535)")
    if scheme == "postgres":
        url = "postgresql" + url[len("postgres") :]
    try:
        return make_url(url)
    except Exception:
        # from None: sqlalchemy's ArgumentError quotes the whole URL, password included.
        raise InvalidDatabaseUrl(f"cannot parse database URL with scheme {scheme!r}") from None


def _port_part(url: str) -> str | None:
    """The text after the host's ':' in ``scheme://[user[:pw]@]host[:port][/db]``, if any."""
    # After the last '@' first: a password (even an unencoded one with '/' or ':') is never read.
    hostport = url.split("://", 1)[1].rpartition("@")[2].split("/", 1)[0].split("?", 1)[0]
    if hostport.startswith("["):  # [ipv6]:port
        hostport = hostport.partition("]")[2]
    return hostport.rpartition(":")[2] if ":" in hostport else None


def _with_driver(url: str, driver: str) -> str:
    return parse_url(url).set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)


def normalize_url(url: str) -> str:
    """The ``postgresql+psycopg://`` form of a PostgreSQL URL, for our own layer."""
    return _with_driver(url, "psycopg")


def dagster_storage_url(url: str) -> str:
    """The ``postgresql+psycopg2://`` form of the same database, for dagster-postgres storage."""
    return _with_driver(url, "psycopg2")


def libpq_url(url: str) -> str:
    """The driver-neutral ``postgresql://`` form (psql, psycopg.connect)."""
    return parse_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def with_database(url: str, database: str) -> str:
    """The same server's URL with another database name (keeps scheme and query, e.g. a socket host)."""
    return parse_url(url).set(database=database).render_as_string(hide_password=False)


def redact(url: str) -> str:
    """The URL with its password replaced by ``***``, fit for messages and logs."""
    try:
        return parse_url(url).render_as_string(hide_password=True)
    except InvalidDatabaseUrl:
        return "<invalid database URL>"


def describe(url: str) -> str:
    """Host, port and database of a URL in words, for error messages (socket URLs name the socket dir)."""
    u = parse_url(url)
    host = u.host or u.query.get("host") or "localhost"
    return f"host={host} port={u.port or 5432} db={u.database}"


def embedded_allowed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process may start (or join) the embedded PostgreSQL: ``RECON_EMBEDDED_POSTGRES=1``."""
    return settings(environ).embedded_postgres


def database_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a database URL can be resolved without failing: the URL is set, or the embedded
    server is allowed."""
    return bool(settings(environ).database_url) or embedded_allowed(environ)


def resolve_database_url(*, allow_embedded: bool = False) -> str:
    """``RECON_DATABASE_URL`` normalised to psycopg 3; the embedded server's URL only where it was
    asked for (``allow_embedded``: the demo, ``dev``, benchmarks; or ``RECON_EMBEDDED_POSTGRES=1``);
    else ``DatabaseNotConfigured``, before anything starts.

    A deployment that forgot the secret must not reconcile an empty database of its own."""
    configured = settings().database_url
    if configured:
        return normalize_url(configured)
    if not (allow_embedded or embedded_allowed()):
        raise DatabaseNotConfigured()
    from recon_dagster.db.embedded import embedded_url

    return normalize_url(embedded_url())


_engines: dict[str, sa.Engine] = {}
_engines_lock = threading.Lock()
# This process's share of RECON_DB_MAX_CONNECTIONS (db/budget.py): a run worker's is set by its
# database resource before the run touches the database; every other process keeps the default.
_pool_limit: int | None = None
_pool_pinned = False


def pool_limit() -> int:
    """The most connections this process's engine holds on the app's database at once."""
    return _pool_limit or OTHER_PROCESS_CONNECTIONS


def limit_pool(connections: int, *, pin: bool = False) -> None:
    """Make ``connections`` this process's share: engines opened from now on hold at most that many
    (pool of that size, no overflow). An engine already open with another share is replaced; the
    connections it has out close as they come back.

    ``pin``: a process that is no part of a deployment's budget (the test harness, which runs many
    runs in-process beside threads of its own) fixes its share; later calls without ``pin`` leave
    it as it is."""
    global _pool_limit, _pool_pinned
    if connections < 1:
        raise ValueError(f"a process needs at least one connection, got {connections}")
    with _engines_lock:
        if _pool_pinned and not pin:
            return
        _pool_pinned = _pool_pinned or pin
        unchanged = connections == pool_limit()
        _pool_limit = connections
        if unchanged:
            return
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        engine.dispose()


def _connect_failure_reason(exc: BaseException, url: URL) -> str:
    # libpq's first line says what went wrong (refused, timeout, auth, unknown db) and never
    # contains the password; strip it anyway in case a server echoes odd things back.
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if url.password:
        text = text.replace(str(url.password), "***")
    return text


def get_engine(url: str | None = None) -> sa.Engine:
    """A pooled psycopg 3 engine for ``url`` (default: ``resolve_database_url()``), one per URL."""
    resolved = normalize_url(url) if url else resolve_database_url()
    with _engines_lock:
        engine = _engines.get(resolved)
        if engine is None:
            engine = _create_engine(resolved)
            _engines[resolved] = engine
        return engine


def _create_engine(url: str) -> sa.Engine:
    parsed = parse_url(url)
    connect_args: dict[str, object] = {"connect_timeout": CONNECT_TIMEOUT_S}
    if settings().db_transaction_pooler:
        # Behind a pooler in transaction mode each transaction may get another server connection,
        # where a statement psycopg prepared on the last one does not exist: never prepare.
        connect_args["prepare_threshold"] = None
    engine = sa.create_engine(
        parsed,
        pool_pre_ping=False,  # pinged only after PING_AFTER_IDLE_S idle: _ping_if_idle below
        # This process's share of RECON_DB_MAX_CONNECTIONS and never more (db/budget.py): a run's
        # threads hold a connection only for short transactions and take turns on the pool.
        pool_size=pool_limit(),
        max_overflow=0,
        pool_timeout=30,
        connect_args=connect_args,
    )

    @sa.event.listens_for(engine, "first_connect")
    def _check_contract(dbapi_connection: DBAPIConnection, _record: sa.pool.ConnectionPoolEntry) -> None:
        # Once per engine (again after a failure): a release the schema no longer serves stops
        # here with one line, before any statement of its own (db/schema_contract.py).
        check_dbapi(dbapi_connection)

    @sa.event.listens_for(engine, "checkin")
    def _returned(_dbapi_connection: object, record: sa.pool.ConnectionPoolEntry) -> None:
        record.info[_RETURNED_AT] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _ping_if_idle(
        dbapi_connection: DBAPIConnection, record: sa.pool.ConnectionPoolEntry, _proxy: object
    ) -> None:
        """Ping a connection that sat in the pool, not one returned a moment ago.

        ``pool_pre_ping`` pings at every checkout: a round trip per transaction, ~1.2 per
        reconciled job, in a batch whose connections go back and forth many times a second. A
        server restart or an idle-session timeout shows on a connection that sat idle, and that
        one is still pinged and replaced (``DisconnectionError`` makes the pool open a new one).
        A connection the server drops within a second of its last use fails its statement
        instead, as one dropped mid-transaction does: the job's attempt is counted and retried."""
        returned = record.info.get(_RETURNED_AT)
        if returned is None or time.monotonic() - returned < PING_AFTER_IDLE_S:
            return  # just opened, or in use a moment ago
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # any failure: the pool replaces the connection
            raise sa.exc.DisconnectionError(f"pooled connection failed its ping: {exc}") from exc

    @sa.event.listens_for(engine, "handle_error")
    def _unavailable(ctx: sa.engine.ExceptionContext) -> DatabaseUnavailable | None:
        # Only failures to open a connection become DatabaseUnavailable; errors of statements
        # on an open connection stay what they are.
        if ctx.connection is None and isinstance(ctx.original_exception, psycopg.OperationalError):
            text = _connect_failure_reason(ctx.original_exception, parsed)
            return DatabaseUnavailable(url, f"{describe(url)}: {text}", connect_failure_kind(text))
        return None

    return engine


def _after_fork_in_child() -> None:
    # A forked child must not use the parent's pooled connections (they share one socket with
    # the parent); drop them without closing, and let the child open its own.
    for engine in list(_engines.values()):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_after_fork_in_child)


def dispose_engines() -> None:
    """Close every cached engine's pool (tests between databases, forked children)."""
    with _engines_lock:
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        engine.dispose()
