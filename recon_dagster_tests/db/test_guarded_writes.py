"""Guarded writes of the jobs table and the ledger's amount rule, pinned one rule at a time:
what each transition clears, who may count an attempt, and how credit amounts are rounded."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.db import credits
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.credits import ledger_amount
from recon_dagster.db.jobs import Claim
from recon_dagster_tests.support.factories import balances, job_row, make_job, make_user

D = Decimal
TTL = timedelta(minutes=10)


def execute(bind: sa.Engine, statement: str, **params: Any) -> None:
    with bind.begin() as conn:
        conn.execute(
            sa.text(statement), {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in params.items()}
        )


def claim(bind: sa.Engine, job: uuid.UUID, owner: str, attempt: int = 0) -> list[Claim]:
    with bind.begin() as conn:
        return jobs_db.claim_jobs(conn, [Claim(job, attempt)], owner, TTL)


def bump(bind: sa.Engine, job: uuid.UUID, owner: str | None, expected: int = 0) -> int | None:
    with bind.begin() as conn:
        return jobs_db.bump_attempts(
            conn,
            job,
            expected_attempts=expected,
            last_error="still running",
            next_in=timedelta(minutes=5),
            owner=owner,
        )


@pytest.fixture
def job(db: sa.Engine) -> uuid.UUID:
    user = make_user(db)
    return make_job(db, user, provider_kind="kie-standard", provider_task_id="t-1", started_minutes_ago=20)


# --- what complete and fail clear ---------------------------------------------------------------


def test_complete_clears_an_old_error_message_and_the_lease(db: sa.Engine, job: uuid.UUID) -> None:
    claim(db, job, "run-a")
    execute(db, "UPDATE jobs SET error_message = 'worker timed out' WHERE id = :id", id=job)

    with db.begin() as conn:
        assert jobs_db.complete_job(
            conn, job, output_data={"k": 1}, provider="kie", provider_cost=0.25, display_cost=4.5
        )

    r = job_row(db, job)
    assert r["error_message"] is None
    assert (r["reconcile_lease_owner"], r["reconcile_lease_expires_at"]) == (None, None)
    assert (r["status"], r["output_data"], r["provider"]) == ("completed", {"k": 1}, "kie")
    assert (r["provider_cost"], r["display_cost"], r["progress"]) == (D("0.25"), D("4.5"), 100)
    assert r["completed_at"] is not None


def test_fail_clears_the_lease_and_keeps_the_message(db: sa.Engine, job: uuid.UUID) -> None:
    claim(db, job, "run-a")
    assert job_row(db, job)["reconcile_lease_owner"] == "run-a"

    with db.begin() as conn:
        assert jobs_db.fail_job(conn, job, "reconcile: upstream failed")

    r = job_row(db, job)
    assert (r["reconcile_lease_owner"], r["reconcile_lease_expires_at"]) == (None, None)
    assert (r["status"], r["error_message"]) == ("failed", "reconcile: upstream failed")
    assert r["completed_at"] is not None


# --- who may count an attempt ---------------------------------------------------------------------


def test_an_owner_may_count_its_attempt_after_its_lease_was_released(db: sa.Engine, job: uuid.UUID) -> None:
    # The run released the lease (or a takeover path cleared it) and then counts the attempt it
    # made: nobody else owns the row, so the count is accepted.
    claim(db, job, "run-a")
    with db.begin() as conn:
        assert jobs_db.release_lease(conn, job, "run-a")

    assert bump(db, job, "run-a") == 1
    assert job_row(db, job)["reconcile_attempts"] == 1


def test_the_lease_owner_may_count_its_attempt(db: sa.Engine, job: uuid.UUID) -> None:
    claim(db, job, "run-a")
    assert bump(db, job, "run-a") == 1


def test_a_bump_without_an_owner_is_accepted_whoever_holds_the_lease(db: sa.Engine, job: uuid.UUID) -> None:
    claim(db, job, "run-a")
    assert bump(db, job, None) == 1


def test_another_run_may_not_count_an_attempt_on_a_leased_row(db: sa.Engine, job: uuid.UUID) -> None:
    claim(db, job, "run-a")
    assert bump(db, job, "run-b") is None
    r = job_row(db, job)
    assert (r["reconcile_attempts"], r["reconcile_lease_owner"]) == (0, "run-a")


def test_bumps_count_one_by_one(db: sa.Engine, job: uuid.UUID) -> None:
    assert [bump(db, job, None, expected=n) for n in range(3)] == [1, 2, 3]
    assert job_row(db, job)["reconcile_last_error"] == "still running"


# --- the ledger's amounts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (D("1.00005"), D("1.0001")),  # half rounds up
        (D("1.00004"), D("1.0000")),
        (D("2.00015"), D("2.0002")),
        (D("0.00005"), D("0.0001")),
        (D("0.00004999"), D("0.0000")),
        (0.1, D("0.1000")),  # a float goes through its short repr, not its binary expansion
        (3, D("3.0000")),
        ("12.5", D("12.5000")),
        (0, D("0.0000")),  # zero is a valid amount (a free job)
    ],
)
def test_ledger_amount_rounds_half_up_to_four_decimals(value: Any, stored: Decimal) -> None:
    got = ledger_amount(value)
    assert got == stored
    assert got.as_tuple().exponent == -4


@pytest.mark.parametrize("value", [-1, D("-0.0001"), D("-0.00001"), "-3"])
def test_ledger_amount_refuses_a_negative_amount_itself(value: Any) -> None:
    with pytest.raises(ValueError, match="finite non-negative"):
        ledger_amount(value)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", float("nan"), float("inf")])
def test_ledger_amount_refuses_what_is_not_finite(value: Any) -> None:
    with pytest.raises(ValueError, match="finite non-negative"):
        ledger_amount(value)


@pytest.mark.parametrize("value", ["abc", "", "1,5"])
def test_ledger_amount_refuses_what_is_not_a_number(value: Any) -> None:
    with pytest.raises(ValueError, match="is not a number"):
        ledger_amount(value)


def test_a_negative_reservation_is_refused_by_the_code_before_the_database(db: sa.Engine) -> None:
    # ValueError from the code's own check, raised before any statement: not the database's
    # CHECK (amount >= 0), which would surface as an IntegrityError.
    user = make_user(db, sub=20, topup=50)
    job = make_job(db, user)
    with db.begin() as conn, pytest.raises(ValueError, match="finite non-negative"):
        credits.reserve_credits_for_job(conn, job, user, D("-5"))
    assert balances(db, user) == (D(20), D(50))


def test_a_reservation_is_stored_rounded_and_its_split_adds_up(db: sa.Engine) -> None:
    user = make_user(db, sub=D("1.00005"), topup=50)
    job = make_job(db, user)
    with db.begin() as conn:
        credits.reserve_credits_for_job(conn, job, user, D("2.00015"))
        row = conn.execute(
            sa.text("SELECT amount, metadata FROM usage_logs WHERE job_id = :j"), {"j": str(job)}
        ).one()
    assert row.amount == D("2.0002")
    assert D(row.metadata["from_sub"]) + D(row.metadata["from_topup"]) == D("2.0002")


@pytest.mark.parametrize("progress", [-5, 0])
def test_progress_below_zero_is_clamped_to_zero(db: sa.Engine, job: uuid.UUID, progress: int) -> None:
    with db.begin() as conn:
        assert jobs_db.set_progress(conn, job, progress)
    assert job_row(db, job)["progress"] == 0


def test_progress_is_never_written_on_a_terminal_row(db: sa.Engine, job: uuid.UUID) -> None:
    execute(db, "UPDATE jobs SET status = 'failed' WHERE id = :id", id=job)
    with db.begin() as conn:
        assert not jobs_db.set_progress(conn, job, 50)
    assert job_row(db, job)["progress"] == 0


# --- anomalies carry what a person needs to resolve them -----------------------------------------


def test_a_refund_to_a_nan_balance_moves_nothing_and_records_both_balances(db: sa.Engine) -> None:
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user)
    with db.begin() as conn:
        credits.record_reservation(conn, job, user, D(30), D(20), D(10))
        # A NaN balance (the app's ledger may hold one). The NOT VALID CHECK an older schema has
        # (migration 138; 146 drops it) is put back only if it was there: the session database is
        # shared, and test_nan_money checks that no such constraint is left.
        had = conn.execute(
            sa.text("SELECT count(*) FROM pg_constraint WHERE conname = 'user_credits_topup_not_nan'")
        ).scalar_one()
        conn.exec_driver_sql("ALTER TABLE user_credits DROP CONSTRAINT IF EXISTS user_credits_topup_not_nan")
        conn.execute(
            sa.text("UPDATE user_credits SET topup_credits = 'NaN' WHERE user_id = :u"), {"u": str(user)}
        )
        if had:
            conn.exec_driver_sql(
                "ALTER TABLE user_credits ADD CONSTRAINT user_credits_topup_not_nan "
                "CHECK (topup_credits <> 'NaN'::numeric) NOT VALID"
            )

    with db.begin() as conn:
        assert credits.refund_reserved_credits_for_job(conn, job) is None
        (a,) = conn.execute(sa.text("SELECT * FROM credit_anomalies")).mappings().all()

    assert (a["job_id"], a["user_id"], a["reason"]) == (job, user, "invalid_user_balance")
    assert a["details"] == {"subscription_credits": "80.0000", "topup_credits": "NaN"}


def test_a_row_read_names_no_nonfinite_timestamps_when_all_are_finite(db: sa.Engine, job: uuid.UUID) -> None:
    with db.begin() as conn:
        row = jobs_db.load_job(conn, job)
    assert row is not None and row.nonfinite == ()


def test_an_infinite_timestamp_is_read_as_none_and_named(db: sa.Engine, job: uuid.UUID) -> None:
    execute(db, "UPDATE jobs SET started_at = 'infinity' WHERE id = :id", id=job)
    with db.begin() as conn:
        row = jobs_db.load_job(conn, job)
    assert row is not None
    assert (row.started_at, row.nonfinite) == (None, ("started_at",))
