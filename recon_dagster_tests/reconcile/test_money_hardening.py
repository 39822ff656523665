"""Issue 8 items 2, 6 and 7 (first part) on real PostgreSQL: rows holding values Python cannot
process are isolated, never fatal; NaN never moves a balance; every reservation of a job is settled
or flagged."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
import sqlalchemy as sa

from recon_dagster.core.runtags import tagged_job_ids
from recon_dagster.db import credits
from recon_dagster.db.jobs import load_job, scan_stale
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.reconcile.test_money_rules import anomaly_reasons
from recon_dagster_tests.support.factories import balances, job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import evaluate_sensor, make_defs, one, tick, usage_status

D = Decimal


def sql(db: sa.Engine, statement: str, **params: object) -> None:
    with db.begin() as conn:
        conn.execute(
            sa.text(statement), {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in params.items()}
        )


def state(db: sa.Engine, job_id: uuid.UUID) -> dict[str, object]:
    """The columns these tests read (``SELECT *`` would load the infinite timestamps)."""
    with db.connect() as conn:
        return dict(
            conn.execute(
                sa.text("SELECT status, reconcile_attempts, reconcile_last_error FROM jobs WHERE id = :j"),
                {"j": str(job_id)},
            )
            .mappings()
            .one()
        )


# ---------------------------------------------------------------------------------------------
# Item 2: a timestamp at +/-infinity never stops the scan, the sweep or reconcile --once
# ---------------------------------------------------------------------------------------------


def test_rows_with_infinite_timestamps_are_isolated_and_good_rows_reconciled(
    db, instance, media_dir, sandbox
):
    user = make_user(db, sub=100, topup=0)
    good_task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    good = make_job(
        db, user, provider_kind="kie-standard", provider_task_id=good_task, started_minutes_ago=11
    )
    good_sync = make_job(db, user, provider_kind="anthropic-sync", started_minutes_ago=6)
    # A recoverable job whose call time is -infinity: its poll answer is still the truth.
    bad_task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    minus_call = make_job(db, user, provider_kind="kie-standard", provider_task_id=bad_task)
    sql(db, "UPDATE jobs SET provider_call_started_at = '-infinity' WHERE id = :j", j=minus_call)
    # Sweep candidates whose age cannot be known: never swept on it, counted instead.
    minus_created = make_job(db, user)
    sql(db, "UPDATE jobs SET created_at = '-infinity' WHERE id = :j", j=minus_created)
    minus_sync = make_job(db, user, provider_kind="elevenlabs-sync")
    sql(db, "UPDATE jobs SET provider_call_started_at = '-infinity', started_at = 'infinity' WHERE id = :j",
        j=minus_sync)  # fmt: skip
    plus_started = make_job(db, user, created_minutes_ago=600)
    sql(db, "UPDATE jobs SET started_at = 'infinity' WHERE id = :j", j=plus_started)
    plus_call = make_job(db, user, provider_kind="kie-standard", provider_task_id="t-plus")
    sql(db, "UPDATE jobs SET provider_call_started_at = 'infinity' WHERE id = :j", j=plus_call)
    for j in (good, good_sync, minus_call, minus_created, minus_sync, plus_started, plus_call):
        reserve(db, j, user, 5)

    with db.connect() as conn:  # the scan itself reads them
        scanned = {r.id: r for r in scan_stale(conn, 50)}
        assert load_job(conn, plus_call).nonfinite == ("provider_call_started_at",)
    assert scanned[minus_created].nonfinite == ("created_at",) and scanned[minus_created].created_at is None
    report = tick(make_defs(media_dir), instance, sweep=True)

    # The one-job run of the unprocessable elevenlabs-sync row errored on its only job: such a run
    # fails on purpose (an outage is loud); every other run, and the tick, went on.
    assert report.failed_runs == 1
    assert state(db, good)["status"] == "completed"
    assert (state(db, good_sync)["status"], usage_status(db, good_sync)) == ("failed", "refunded")
    assert state(db, minus_call)["status"] == "completed"
    assert "nonfinite_timestamp" in anomaly_reasons(db, minus_call)
    for j in (minus_created, minus_sync):
        row = state(db, j)
        assert (row["status"], row["reconcile_attempts"]) == ("processing", 1)
        assert "non-finite" in row["reconcile_last_error"]
        assert usage_status(db, j) == "reserved"
        assert anomaly_reasons(db, j) == ["nonfinite_timestamp"]
    for j in (plus_started, plus_call):  # never due: not stuck yet as far as anyone can tell
        assert (state(db, j)["status"], state(db, j)["reconcile_attempts"]) == ("processing", 0)


def test_a_sensor_tick_survives_an_infinite_call_time(db, instance, media_dir, sandbox):
    user = make_user(db)
    bad = make_job(db, user, provider_kind="kie-veo", provider_task_id="t-inf")
    sql(db, "UPDATE jobs SET provider_call_started_at = '-infinity' WHERE id = :j", j=bad)
    good = make_job(db, user, provider_kind="kie-standard", provider_task_id="t-ok", started_minutes_ago=11)

    result = evaluate_sensor(make_defs(media_dir), instance)

    assert {j for rr in result.run_requests for j in tagged_job_ids(rr.tags)} == {str(bad), str(good)}


def test_an_exhausted_row_with_an_infinite_age_is_failed_and_refunded_at_the_cap(
    db, instance, media_dir, sandbox
):
    user = make_user(db, sub=10, topup=0)
    job = make_job(db, user, reconcile_attempts=17)
    sql(db, "UPDATE jobs SET created_at = '-infinity' WHERE id = :j", j=job)
    reserve(db, job, user, 10)

    tick(make_defs(media_dir), instance, sweep=True)

    assert (state(db, job)["status"], usage_status(db, job)) == ("failed", "refunded")
    assert balances(db, user) == (D(10), D(0))
    assert set(anomaly_reasons(db, job)) == {"nonfinite_timestamp", "reconcile_exhausted"}


# ---------------------------------------------------------------------------------------------
# Item 6: NaN
# ---------------------------------------------------------------------------------------------


def _nan_reservation(db: sa.Engine, job: uuid.UUID, user: uuid.UUID) -> None:
    """A NaN amount in the app's ledger (which may hold one: no CHECK of ours refuses it)."""
    with db.begin() as conn:
        had = conn.execute(
            sa.text("SELECT count(*) FROM pg_constraint WHERE conname = 'usage_logs_amount_not_nan'")
        ).scalar_one()
        conn.exec_driver_sql("ALTER TABLE usage_logs DROP CONSTRAINT IF EXISTS usage_logs_amount_not_nan")
        conn.execute(
            sa.text(
                "INSERT INTO usage_logs (job_id, user_id, status, amount, metadata) "
                'VALUES (:j, :u, \'reserved\', \'NaN\', \'{"from_sub": "NaN", "from_topup": "0"}\')'
            ),
            {"j": str(job), "u": str(user)},
        )
        if had:
            conn.exec_driver_sql(
                "ALTER TABLE usage_logs ADD CONSTRAINT usage_logs_amount_not_nan "
                "CHECK (amount <> 'NaN'::numeric) NOT VALID"
            )


def test_a_nan_reservation_never_moves_a_balance_on_refund(db, instance, media_dir, sandbox):
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user, provider_kind="anthropic-sync", started_minutes_ago=6)
    _nan_reservation(db, job, user)

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
    _nan_reservation(db, job, user)

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
    """The ledger is the app's: the NaN CHECKs the first 138 added are gone (146), and the guard
    against a NaN is recon_dagster's own code (the tests above)."""
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


# ---------------------------------------------------------------------------------------------
# Item 7 (first part): a second reservation on one job
# ---------------------------------------------------------------------------------------------


def _twice_reserved(db: sa.Engine, **job_kw: object) -> tuple[uuid.UUID, uuid.UUID, list[uuid.UUID]]:
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user, **job_kw)  # type: ignore[arg-type]
    logs = [
        reserve(db, job, user, 30, from_sub=20, from_topup=10),
        reserve(db, job, user, 12, from_sub=12, from_topup=0),
    ]
    return user, job, logs


def _statuses(db: sa.Engine, logs: list[uuid.UUID]) -> list[str]:
    return [one(db, "SELECT status FROM usage_logs WHERE id = :i", i=i) for i in logs]


def test_every_reservation_of_a_failed_job_is_refunded_and_flagged(db, instance, media_dir, sandbox):
    user, job, logs = _twice_reserved(db, provider_kind="anthropic-sync", started_minutes_ago=6)

    tick(make_defs(media_dir), instance, sweep=True)

    assert job_row(db, job)["status"] == "failed"
    assert _statuses(db, logs) == ["refunded", "refunded"]
    assert balances(db, user) == (D(100), D(50))
    assert anomaly_reasons(db, job) == ["extra_reservation"]


def test_a_completed_job_is_charged_once_and_its_extra_reservation_refunded_and_flagged(
    db, instance, media_dir, sandbox
):
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    user, job, logs = _twice_reserved(
        db, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=11
    )

    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "completed"
    assert _statuses(db, logs) == ["committed", "refunded"]
    assert balances(db, user) == (D(80), D(40))  # the first reservation spent, the extra back
    assert anomaly_reasons(db, job) == ["extra_reservation"]
    with db.begin() as conn:  # settling again finds nothing: no second commit or refund
        assert credits.commit_job_credits(conn, job, 1) is None
        assert credits.refund_reserved_credits_for_job(conn, job) is None
    assert balances(db, user) == (D(80), D(40))
