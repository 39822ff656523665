"""A database without the contract's functions, or with an older contract, stops a worker at its
start with one line (run migrate); ``migrate --plan`` shows the functions it would create; the SQL
identity of a create is the library's."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from recon_dagster.db import contract, ledger
from recon_dagster.db.migrate import discover, migrate
from recon_dagster.db.migration_plan import plan, render
from recon_dagster.worker import ContractUnavailable, check_contract, mark_provider_call_start

CONTRACT_MIGRATION = 160


@pytest.fixture
def before_contract(engine: sa.Engine) -> Iterator[sa.Engine]:
    """A database of its own migrated up to, not including, the contract's migration: an app's
    database before this release."""
    name = f"recon_test_{secrets.token_hex(6)}"
    admin = sa.create_engine(
        engine.url.set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
    )
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    old = sa.create_engine(engine.url.set(database=name), poolclass=sa.pool.NullPool)
    try:
        migrate(old, [m for m in discover() if m.version < CONTRACT_MIGRATION])
        yield old
    finally:
        old.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def test_a_database_without_the_functions_stops_the_worker_at_start_with_one_line(
    before_contract: sa.Engine,
) -> None:
    with pytest.raises(ContractUnavailable) as missing:
        check_contract(before_contract)
    assert str(missing.value) == (
        "the app's database has no recon_dagster contract functions (recon.contract_version() is missing): "
        "run `recon-dagster migrate`"
    )
    with pytest.raises(ContractUnavailable, match="run `recon-dagster migrate`"):  # the library's first call
        mark_provider_call_start(uuid.uuid4(), "anthropic-sync", engine=before_contract)

    migrate(before_contract)
    check_contract(before_contract)


def test_a_worker_built_for_a_newer_contract_stops_at_start_with_one_line(
    db: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_contract(db)
    monkeypatch.setattr(contract, "CONTRACT_VERSION", contract.CONTRACT_VERSION + 1)
    with pytest.raises(ContractUnavailable) as older:
        check_contract(db)
    assert str(older.value) == (
        f"the app's database has contract version {contract.CONTRACT_VERSION - 1}, this worker needs "
        f"{contract.CONTRACT_VERSION}: run `recon-dagster migrate`"
    )
    assert "\n" not in str(older.value)


def test_migrate_plan_shows_every_contract_function(before_contract: sa.Engine) -> None:
    shown = render(plan(before_contract), "the app's database")

    assert "160_app_contract" in shown
    for function in [*contract.FUNCTIONS, "contract_version"]:
        assert f"FUNCTION recon.{function}(" in shown, function


def test_the_database_answers_the_contract_version_this_library_was_built_for(db: sa.Engine) -> None:
    with db.connect() as conn:
        assert contract.database_version(conn) == contract.CONTRACT_VERSION


@settings(max_examples=200, deadline=None)
@given(job=st.uuids(), seq=st.integers(min_value=1, max_value=2**62))
def test_the_sql_create_id_is_the_librarys(engine: sa.Engine, job: uuid.UUID, seq: int) -> None:
    """The orphan sweep maps a marker to its create with the Python ``create_id``; the function
    names the create it records with the SQL one: they must agree for every job and number."""
    with engine.connect() as conn:
        got = conn.execute(sa.text("SELECT recon.create_id(:j, :s)"), {"j": str(job), "s": seq}).scalar_one()
    assert uuid.UUID(str(got)) == ledger.create_id(job, seq)


def test_a_role_granted_recon_app_worker_keeps_the_contract_and_public_cannot_call_it(db: sa.Engine) -> None:
    """The app's workers' role needs only recon_app_worker (and what it already has on the app's
    own tables); a role without it cannot call the functions."""
    worker, stranger = (f"recon_test_{secrets.token_hex(4)}" for _ in range(2))
    job = uuid.uuid4()
    with db.begin() as conn:
        conn.execute(sa.text("INSERT INTO jobs (id, user_id, job_type, status) VALUES (:j, :u, 'image', 'processing')"),
                     {"j": str(job), "u": str(uuid.uuid4())})  # fmt: skip
    try:
        with db.begin() as conn:
            conn.exec_driver_sql(f'CREATE ROLE "{worker}" NOLOGIN IN ROLE recon_app_worker')
            conn.exec_driver_sql(f'CREATE ROLE "{stranger}" NOLOGIN')
            # What the app's workers already have on the app's own tables.
            conn.exec_driver_sql(f'GRANT SELECT, UPDATE ON jobs TO "{worker}"')
            conn.exec_driver_sql(f'GRANT SELECT, INSERT ON credit_anomalies TO "{worker}"')
        with db.begin() as conn:
            conn.exec_driver_sql(f'SET LOCAL ROLE "{worker}"')
            intent = contract.call(
                conn, "create_intent", job=str(job), provider="replicate", kind="replicate-prediction"
            )
            answer = contract.call(
                conn, "create_answered", job=str(job), provider="replicate", kind="replicate-prediction",
                task_id="t-1", create=intent["create_id"],
            )  # fmt: skip
        assert answer["next"] == "poll"
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"), db.begin() as conn:
            conn.exec_driver_sql(f'SET LOCAL ROLE "{stranger}"')
            contract.call(conn, "resume_point", job=str(job))
    finally:
        with db.begin() as conn:
            for role in (worker, stranger):
                conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
                conn.exec_driver_sql(f'DROP ROLE IF EXISTS "{role}"')
