"""NaN never moves a balance: a reservation or a balance holding NaN (the app's ledger may hold one)
is refunded or committed without touching the user's credits and logged as an anomaly, and recording
a reservation checks every money value first. Real PostgreSQL."""

from __future__ import annotations

from decimal import Decimal

import pytest
import sqlalchemy as sa

from recon_dagster.db import credits
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import (
    balances,
    job_row,
    make_job,
    make_user,
    nan_reservation,
    reserve,
)
from recon_dagster_tests.support.ledger import anomaly_reasons
from recon_dagster_tests.support.reconcile import make_defs, tick, usage_status

D = Decimal


def test_a_nan_reservation_never_moves_a_balance_on_refund(db, instance, media_dir, sandbox):
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user, provider_kind="anthropic-sync", started_minutes_ago=6)
    nan_reservation(db, job, user)

    report = tick(make_defs(media_dir), instance, sweep=True)

    assert report.failed_runs == 0
    assert job_row(db, job)["status"] == "failed"
    assert balances(db, user) == (D(100), D(50))
    assert usage_status(db, job) == "reserved"  # left for a person, and no_credit_leak shows it
    assert anomaly_reasons(db, job) == ["invalid_credit_amount"]


def test_a_nan_reservation_never_moves_a_balance_on_commit(db, instance, media_dir, sandbox):
    user = make_user(db, sub=100, topup=50)
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=11)
    nan_reservation(db, job, user)

    tick(make_defs(media_dir), instance)

    row = job_row(db, job)
    assert row["status"] == "completed"
    assert row["display_cost"] is None  # never the NaN
    assert balances(db, user) == (D(100), D(50))
    assert usage_status(db, job) == "reserved"
    assert anomaly_reasons(db, job) == ["invalid_credit_amount"]


def test_a_user_whose_balance_is_already_nan_gets_no_balance_move_and_an_anomaly(
    db, instance, media_dir, sandbox
):
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user, provider_kind="anthropic-sync", started_minutes_ago=6)
    reserve(db, job, user, 30, from_sub=20, from_topup=10)
    with db.begin() as conn:  # the app's ledger accepts a NaN: the table is the app's
        conn.execute(
            sa.text("UPDATE user_credits SET topup_credits = 'NaN' WHERE user_id = :u"), {"u": str(user)}
        )

    report = tick(make_defs(media_dir), instance, sweep=True)

    assert report.failed_runs == 0
    assert job_row(db, job)["status"] == "failed"
    assert usage_status(db, job) == "reserved"
    assert balances(db, user)[0] == D(80)
    assert anomaly_reasons(db, job) == ["invalid_user_balance"]


def test_no_constraint_of_ours_is_left_on_the_apps_ledger(db):
    """The ledger is the app's: the NaN CHECKs migration 138 added are gone (146 drops them), and the
    guard against a NaN is recon_dagster's own code (the tests above)."""
    with db.connect() as conn:
        names = set(
            conn.execute(
                sa.text(
                    "SELECT conname FROM pg_constraint WHERE conrelid IN "
                    "(to_regclass('usage_logs'), to_regclass('user_credits')) AND conname LIKE '%not_nan'"
                )
            ).scalars()
        )
    assert names == set()


@pytest.mark.parametrize(
    ("amount", "from_sub", "from_topup"),
    [(D("NaN"), D(0), D(0)), (D(5), D("NaN"), D(5)), (D(5), D(-1), D(6)), (D(5), D("Infinity"), D(0))],
)
def test_recording_a_reservation_validates_every_money_value_before_moving_a_balance(
    db, amount, from_sub, from_topup
):
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user)
    with pytest.raises(ValueError, match="credit amount"), db.begin() as conn:
        credits.record_reservation(conn, job, user, amount, from_sub, from_topup)
    assert balances(db, user) == (D(100), D(50))
