"""Shared fixtures: a fresh, migrated PostgreSQL database per test session.

With ``RECON_DATABASE_URL`` set, the database is created on that server; otherwise on the embedded
server (``recon_dagster.db.embedded``). Either way it is ``recon_test_<random>``, dropped at the end,
and ``RECON_DATABASE_URL`` points at it for the session, so code under test (and subprocesses it
starts) that resolves the URL itself hits the same database.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.db.engine import (
    DATABASE_URL_ENV,
    EMBEDDED_ENV,
    DatabaseUnavailable,
    dispose_engines,
    get_engine,
    limit_pool,
    normalize_url,
    redact,
    with_database,
)
from recon_dagster.db.migrate import migrate
from recon_dagster.sandbox import SandboxServer
from recon_dagster_tests.support import markers, scheduling
from recon_dagster_tests.support.fixtures import user  # noqa: F401  (a fixture any test can ask for)
from recon_dagster_tests.support.instance import drop_storage_template
from recon_dagster_tests.support.s3 import moto_endpoint  # noqa: F401  (a fixture any test can ask for)

# The tests opt into the embedded PostgreSQL (a deployment never does: there a missing
# RECON_DATABASE_URL is an error): without a URL, code under test and the processes it starts may
# start or join it, as the demo and `recon-dagster dev` do.
if not os.environ.get(DATABASE_URL_ENV, "").strip():
    os.environ.setdefault(EMBEDDED_ENV, "1")

# The test process is no part of a deployment's connection budget: it runs runs in-process (which
# would take a run worker's share, 2) beside race tests whose threads each hold a connection. It
# keeps 10, what every process had before the budget.
TEST_PROCESS_CONNECTIONS = 10
limit_pool(TEST_PROCESS_CONNECTIONS, pin=True)

# The host app's tables (migration 001). ``db`` empties these and every table a later migration
# adds (e.g. reconcile_events), all but the migrations bookkeeping.
APP_TABLES = (
    "jobs",
    "usage_logs",
    "user_credits",
    "assets",
    "workflow_executions",
    "credit_anomalies",
    "characters",
)


# Workers for ``-n auto`` (pyproject's addopts): two per core, at most four. A worker spends much
# of a test waiting (on PostgreSQL, a daemon's tick, a run, a browser): on two cores two workers
# kept 1.2 of them busy. The daemon and browser tests still run one at a time each
# (``markers.schedule``: one xdist group each, ``--dist loadgroup``), so no more of them share the
# cores than before, where their deadlines are measured.
MAX_AUTO_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    configured = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip()
    if configured:
        return int(configured)
    return max(1, min(MAX_AUTO_WORKERS, 2 * (os.cpu_count() or 1)))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups off the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with what it needs (``postgres``) and whether it is ``slow``, from its
    fixtures and folder, then group and order them for the workers (``support/markers.py``)."""
    for item in items:
        markers.apply(item)
    scheduling.record(config, markers.schedule(items))


def pytest_configure(config: pytest.Config) -> None:
    scheduling.prepare(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    scheduling.finish(config)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadgroup`` with the groups the workers recorded (``support/scheduling.py``)."""
    if config.getvalue("dist") == "loadgroup":
        return scheduling.GroupScheduling(config, log)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    # The running test, for the daemon and browser helpers' marker check (markers.require_marker).
    markers.set_current(item)
    try:
        return (yield)
    finally:
        markers.set_current(None)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _server_url() -> str:
    configured = os.environ.get(DATABASE_URL_ENV, "").strip()
    if configured:
        return normalize_url(configured)
    from recon_dagster.db.embedded import embedded_url

    return normalize_url(embedded_url("postgres"))


def _admin_engine(server_url: str) -> sa.Engine:
    # Its own small engine: CREATE/DROP DATABASE cannot run inside a transaction.
    return sa.create_engine(
        server_url,
        isolation_level="AUTOCOMMIT",
        poolclass=sa.pool.NullPool,
        connect_args={"connect_timeout": 5},
    )


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """URL (psycopg 3 form) of a fresh database on the configured or embedded server."""
    server_url = _server_url()
    admin = _admin_engine(server_url)
    name = f"recon_test_{secrets.token_hex(6)}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except (sa.exc.OperationalError, DatabaseUnavailable) as exc:
        message = f"PostgreSQL at {redact(server_url)} does not answer: {str(exc).splitlines()[0]}"
        if _in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)

    url = with_database(server_url, name)
    previous = os.environ.get(DATABASE_URL_ENV)
    os.environ[DATABASE_URL_ENV] = url
    try:
        yield url
    finally:
        if previous is None:
            os.environ.pop(DATABASE_URL_ENV, None)
        else:
            os.environ[DATABASE_URL_ENV] = previous
        dispose_engines()
        drop_storage_template(url)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture(scope="session")
def engine(database_url: str) -> sa.Engine:
    """The session database's engine, with every migration applied."""
    eng = get_engine(database_url)
    migrate(eng)
    return eng


@pytest.fixture
def db(engine: sa.Engine) -> sa.Engine:
    """The migrated engine with every app table emptied (identities restarted) for this test.

    Only what the last test left is emptied: one round trip finds the tables with a row and the
    sequences they own that moved, and only those are truncated and restarted (a TRUNCATE of every
    table cost about a third of a second a test, most of them on empty tables).
    """
    with engine.begin() as conn:
        dirty_tables, moved_sequences = _left_behind(conn)
        if dirty_tables:
            conn.exec_driver_sql(f"TRUNCATE {', '.join(dirty_tables)} RESTART IDENTITY CASCADE")
        for sequence in moved_sequences:
            conn.exec_driver_sql(f"ALTER SEQUENCE {sequence} RESTART")
    return engine


def _app_tables(conn: sa.Connection) -> list[str]:
    tables = conn.execute(
        sa.text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename <> 'recon_schema_migrations'"
        )
    ).scalars()
    return sorted(set(APP_TABLES) | set(tables))


def _left_behind(conn: sa.Connection) -> tuple[list[str], list[str]]:
    """(app tables with at least one row, sequences owned by an app table that were used)."""
    tables = _app_tables(conn)
    # A used sequence of an empty table (an insert rolled back) is restarted too, as TRUNCATE's
    # RESTART IDENTITY would have.
    probe = " UNION ALL ".join(f"SELECT '{t}' WHERE EXISTS (SELECT 1 FROM {t})" for t in tables)
    dirty = list(conn.exec_driver_sql(probe).scalars())
    moved = conn.execute(
        sa.text(
            """
            SELECT format('%I.%I', s.schemaname, s.sequencename)
            FROM pg_sequences s
            JOIN pg_class c ON c.relname = s.sequencename
            JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = s.schemaname
            JOIN pg_depend d ON d.objid = c.oid AND d.deptype IN ('a', 'i')
            JOIN pg_class owner ON owner.oid = d.refobjid
            WHERE s.schemaname = 'public' AND s.last_value IS NOT NULL
              AND owner.relname = ANY(:tables)
            """
        ),
        {"tables": tables},
    ).scalars()
    return dirty, list(moved)


@pytest.fixture
def fresh_engine(engine: sa.Engine) -> Iterator[sa.Engine]:
    """An engine whose connections see only an empty schema of their own (first in search_path).

    A schema, not a database: CREATE/DROP DATABASE cost a checkpoint each, seconds on a busy
    embedded server, while the runner behaves the same in any schema.
    """
    schema = f"recon_mig_{secrets.token_hex(5)}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    # libpq's options parameter in the URL, so the URL alone (migrate_command) reaches the schema.
    scoped = sa.create_engine(engine.url.update_query_dict({"options": f"-c search_path={schema}"}))
    try:
        yield scoped
    finally:
        scoped.dispose()
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')


# --- the provider sandbox, a Dagster instance, a media folder ------------------------------------


@pytest.fixture(scope="module")
def sandbox(engine: sa.Engine) -> Iterator[SandboxServer]:
    """The loopback provider sandbox, with the provider env vars pointing at it.

    With the session database migrated: every provider call goes through the account's shared limiter,
    which keeps its tokens and slots in PostgreSQL (so a test using the sandbox is ``postgres``).
    """
    with SandboxServer() as sb:
        saved = {k: os.environ.get(k) for k in sb.env()}
        os.environ.update(sb.env())
        try:
            yield sb
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture(scope="session")
def _empty_instance_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty persistent Dagster instance's folder, its SQLite storage created once per worker:
    creating it (Dagster's schema migrations) takes seconds, copying the files a few milliseconds."""
    path = tmp_path_factory.mktemp("dagster-instance-template")
    with dg.instance_for_test(temp_dir=str(path)):
        pass
    return path


@pytest.fixture
def instance(
    _empty_instance_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dg.DagsterInstance]:
    """A throwaway persistent Dagster instance (sensor contexts need a persistent one): a copy of
    an empty one, its own folder and storage."""
    path = tmp_path_factory.mktemp("dagster-instance") / "home"
    shutil.copytree(_empty_instance_dir, path)
    with dg.instance_for_test(temp_dir=str(path)) as inst:
        yield inst
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def media_dir(tmp_path: Path) -> str:
    d = tmp_path / "media"
    d.mkdir()
    return str(d)


@pytest.fixture
def provider_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every provider's key set (to a placeholder): a provider without its key is not wired, so a
    test of the sensor's or a run's choices among providers judges configured ones. The ``sandbox``
    fixture sets real ones for the sandbox instead."""
    from recon_dagster.providers.resource import api_key_env_vars

    for env in api_key_env_vars():
        monkeypatch.setenv(env, os.environ.get(env) or "placeholder-key")
