"""Migrating a live app's database on real PostgreSQL: an open app transaction, an interrupted
concurrent build, the baseline on the app's own tables, and ``migrate --plan``."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal

import pytest
import sqlalchemy as sa

from recon_dagster.db.migrate import (
    BOOKKEEPING_TABLE,
    DEFAULT_LOCK_TIMEOUT,
    MigrationError,
    discover,
    migrate,
)
from recon_dagster_tests.db.app_shaped import app_schema, create_app_tables
from recon_dagster_tests.support.migrations import migrate_command

LOCK_TIMEOUT_S = float(DEFAULT_LOCK_TIMEOUT.rstrip("s"))
OUR_INDEXES_ON_APP_TABLES = {
    "jobs_inflight_idx",
    "jobs_taskless_inflight_idx",
    "jobs_provider_task_idx",
    "usage_logs_reserved_idx",
    "characters_training_job_id_idx",
}


@contextmanager
def app_transaction_holding_a_job(engine: sa.Engine) -> Iterator[tuple[sa.Connection, uuid.UUID]]:
    """An app worker between two writes: one jobs row updated, not committed."""
    job = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, user_id, job_type, status) VALUES (:j, :u, 'image', 'processing')"
            ),
            {"j": str(job), "u": str(uuid.uuid4())},
        )
    conn = engine.connect()
    tx = conn.begin()
    conn.execute(sa.text("UPDATE jobs SET progress = 50 WHERE id = :j"), {"j": str(job)})
    try:
        yield conn, job
    finally:
        if tx.is_active:
            tx.rollback()
        conn.close()


class MigrateInThread:
    """``migrate`` in a thread, its messages kept."""

    def __init__(self, engine: sa.Engine, **kwargs: object) -> None:
        self.said: list[str] = []
        self.result: list[str] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(engine,), kwargs=kwargs, daemon=True)
        self.thread.start()

    def _run(self, engine: sa.Engine, **kwargs: object) -> None:
        try:
            self.result = migrate(engine, say=self.said.append, **kwargs)  # type: ignore[arg-type]
        except BaseException as exc:  # asserted by the test
            self.error = exc

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"migrate still running after {timeout} s: {self.said}"


def wait_for(what: str, check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def migrate_backend(engine: sa.Engine, query_like: str) -> int | None:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'recon-dagster migrate' "
                "AND query ILIKE :q AND state = 'active' LIMIT 1"
            ),
            {"q": query_like},
        ).scalar()


def app_tables_on(engine: sa.Engine) -> None:
    """A database on which the app runs: its tables exist, recon_dagster has never migrated it."""
    create_app_tables(engine)


@pytest.mark.slow
def test_an_open_app_transaction_never_stalls_app_writes_and_migrate_finishes_after_it(
    fresh_engine: sa.Engine,
) -> None:
    app_tables_on(fresh_engine)
    with app_transaction_holding_a_job(fresh_engine) as (app_tx, _job):
        running = MigrateInThread(fresh_engine)
        # migrate queues its ACCESS EXCLUSIVE lock on jobs behind the open transaction...
        wait_for(
            "migrate to wait for its lock on jobs", lambda: migrate_backend(fresh_engine, "ALTER TABLE jobs%")
        )
        # ...and an app INSERT queued behind it returns within the lock timeout, every time.
        latencies = []
        for _ in range(3):
            with fresh_engine.begin() as conn:
                conn.exec_driver_sql("SET LOCAL statement_timeout = '20s'")
                started = time.monotonic()
                conn.execute(
                    sa.text("INSERT INTO jobs (user_id, job_type) VALUES (:u, 'image')"),
                    {"u": str(uuid.uuid4())},
                )
                latencies.append(time.monotonic() - started)
            time.sleep(0.3)
        assert max(latencies) < LOCK_TIMEOUT_S + 1.0, latencies
        assert running.thread.is_alive() and running.result is None  # still retrying
        assert any(
            "lock not granted within lock_timeout" in line and "held by pid" in line for line in running.said
        )
        app_tx.commit()
    running.join(60)
    assert running.error is None, running.error
    assert running.result == [m.name for m in discover()]


def test_an_interrupted_concurrent_build_is_resumed(fresh_engine: sa.Engine) -> None:
    app_tables_on(fresh_engine)
    # The app already added 135's columns itself: the ALTER is skipped and takes no lock, so only
    # the concurrent build waits for the open app transaction (it blocks none of the app's writes).
    m135 = next(m for m in discover() if m.version == 135)
    with fresh_engine.begin() as conn:
        conn.exec_driver_sql(next(st.text for st in m135.statements if st.added_columns))
    with app_transaction_holding_a_job(fresh_engine) as (app_tx, _job):
        running = MigrateInThread(fresh_engine)
        wait_for(
            "the build of jobs_inflight_idx",
            lambda: migrate_backend(fresh_engine, "CREATE INDEX CONCURRENTLY%"),
        )
        with fresh_engine.begin() as conn:  # the app writes on while the build waits
            conn.execute(
                sa.text("INSERT INTO jobs (user_id, job_type) VALUES (:u, 'image')"), {"u": str(uuid.uuid4())}
            )
            pid = migrate_backend(fresh_engine, "CREATE INDEX CONCURRENTLY%")
            conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})  # migrate dies mid-build
        running.join(30)
        assert running.error is not None
        app_tx.commit()
    with fresh_engine.connect() as conn:
        assert not conn.execute(
            sa.text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('jobs_inflight_idx')")
        ).scalar()
        assert 135 not in set(conn.execute(sa.text(f"SELECT version FROM {BOOKKEEPING_TABLE}")).scalars())
    said: list[str] = []
    migrate(fresh_engine, say=said.append)
    assert any("jobs_inflight_idx is INVALID" in line for line in said), said
    with fresh_engine.connect() as conn:
        assert conn.execute(
            sa.text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('jobs_inflight_idx')")
        ).scalar()
        assert 135 in set(conn.execute(sa.text(f"SELECT version FROM {BOOKKEEPING_TABLE}")).scalars())


def test_the_baseline_leaves_the_apps_tables_as_they_are(fresh_engine: sa.Engine) -> None:
    app_tables_on(fresh_engine)
    user, two_assets = uuid.uuid4(), uuid.uuid4()
    with fresh_engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO jobs (id, user_id, job_type, status) VALUES (:j, :u, 'image', 'completed')"),
            {"j": str(two_assets), "u": str(user)},
        )
        for key in ("a.png", "b.png"):  # the app gave this job two assets
            conn.execute(
                sa.text(
                    "INSERT INTO assets (user_id, job_id, asset_type, storage_key, is_public) "
                    "VALUES (:u, :j, 'image', :k, true)"
                ),
                {"u": str(user), "j": str(two_assets), "k": key},
            )
    before = app_schema(fresh_engine)

    assert migrate(fresh_engine) == [m.name for m in discover()]

    after = app_schema(fresh_engine)
    assert after["constraints"] == before["constraints"]  # no constraint of ours on the app's tables
    assert set(before["indexes"]) <= set(after["indexes"])  # the app's indexes unchanged
    added = {name for _table, name, _def in set(after["indexes"]) - set(before["indexes"])}
    assert added == OUR_INDEXES_ON_APP_TABLES
    with fresh_engine.connect() as conn:
        assert (
            conn.execute(
                sa.text("SELECT count(*) FROM assets WHERE job_id = :j"), {"j": str(two_assets)}
            ).scalar()
            == 2
        )


def test_a_stuck_job_on_the_apps_tables_gets_exactly_one_asset(
    fresh_engine: sa.Engine,
    sandbox,
    media_dir,
) -> None:
    from recon_dagster.media.store import LocalMediaStore
    from recon_dagster.providers import providers_from_env
    from recon_dagster.reconcile.finalize import MediaPolicy, ProviderResult, finalize_job_with_media
    from recon_dagster.sandbox import Scenario
    from recon_dagster_tests.support.factories import balances, make_job, make_user, reserve

    app_tables_on(fresh_engine)
    migrate(fresh_engine)
    user = make_user(fresh_engine, sub=100, topup=0)
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    job = make_job(
        fresh_engine, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=30
    )
    reserve(fresh_engine, job, user, 10)
    result = ProviderResult.from_status(providers_from_env().poll("kie-standard", task))
    store = LocalMediaStore(base_dir=media_dir)
    policy = MediaPolicy(headers_for=providers_from_env().media_headers)

    first = finalize_job_with_media(fresh_engine, store, job, result, source="reconcile", policy=policy)
    second = finalize_job_with_media(fresh_engine, store, job, result, source="webhook", policy=policy)

    assert first.ok and first.asset_created and not second.ok
    with fresh_engine.connect() as conn:
        assert (
            conn.execute(sa.text("SELECT count(*) FROM assets WHERE job_id = :j"), {"j": str(job)}).scalar()
            == 1
        )
    assert balances(fresh_engine, user) == (Decimal(90), Decimal(0))


def test_a_gap_in_the_apps_tables_is_one_line_each_and_changes_nothing(
    fresh_engine: sa.Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    app_tables_on(fresh_engine)
    with fresh_engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE jobs DROP COLUMN node_id")
        conn.exec_driver_sql("ALTER TABLE jobs ALTER COLUMN started_at TYPE timestamp")
        conn.exec_driver_sql("ALTER TABLE assets ADD COLUMN tenant_id uuid NOT NULL")
        conn.exec_driver_sql("DROP TABLE characters")
    before = app_schema(fresh_engine)
    with pytest.raises(MigrationError) as err:
        migrate(fresh_engine)
    assert sorted(err.value.details) == [
        "assets.tenant_id: NOT NULL without a default, and recon_dagster's insert into assets does not set it",
        "characters: table missing (recon_dagster reads id, user_id, name, training_status, "
        "replicate_training_id, training_job_id, lora_weights_url, error_message, training_started_at, "
        "created_at, updated_at)",
        "jobs.node_id: column missing (recon_dagster reads it as text)",
        "jobs.started_at: timestamp without time zone, recon_dagster needs timestamptz",
    ]
    assert app_schema(fresh_engine) == before
    with fresh_engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT count(*) FROM {BOOKKEEPING_TABLE}")).scalar() == 0
        assert "provider_kind" not in set(
            conn.execute(
                sa.text(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = 'jobs'"
                )
            ).scalars()
        )
    # The command prints each gap on its own line, then the one-line error.
    url = fresh_engine.url.render_as_string(hide_password=False)
    assert migrate_command(url) == 1
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert err_lines[:-1] == [f"migrate: gap: {g}" for g in err.value.details]
    assert err_lines[-1].startswith("recon-dagster migrate: the app's tables lack 4 thing(s)")


def test_plan_lists_each_lock_and_the_app_tables_and_writes_nothing(
    fresh_engine: sa.Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    app_tables_on(fresh_engine)
    before = app_schema(fresh_engine)
    url = fresh_engine.url.render_as_string(hide_password=False)

    assert migrate_command(url, "--plan") == 0
    out = capsys.readouterr().out

    assert f"{len(discover())} pending migration(s)" in out
    assert "001_host_app_baseline: check only: the app's tables exist" in out
    assert "no gap: every table and column recon_dagster reads is there" in out
    section = out.split("135_external_call_reconciliation: ")[1].split("\n\n")[0]
    assert section.startswith("statement by statement")
    assert (
        "lock: ACCESS EXCLUSIVE on jobs (the app's): the app's writes to jobs queue for <= lock_timeout 2s"
        in section
    )
    assert (
        "lock: SHARE UPDATE EXCLUSIVE on jobs (the app's) for the whole build: its reads and writes go on"
        in section
    )
    assert "app tables touched: jobs" in section
    assert (
        "app tables touched: usage_logs, characters" in out
        or "app tables touched: characters, usage_logs" in out
    )
    assert app_schema(fresh_engine) == before
    with fresh_engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT to_regclass('{BOOKKEEPING_TABLE}')")).scalar() is None
