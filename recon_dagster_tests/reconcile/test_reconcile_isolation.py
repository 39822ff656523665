"""One job whose settle step raises (fail, refund, force-fail, sweep) never takes its batch down:
it becomes a counted ERROR outcome plus a ``reconcile_settle_error`` anomaly, never climbs past the
attempt cap, and every other job of the batch is still settled and reported.

The failure is injected the way production meets it: by PostgreSQL itself, a trigger that refuses
any balance change of one user (as a ``numeric(14,4)`` overflow on a refund does).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import KINDS, MAX_ATTEMPTS
from recon_dagster.db import jobs as jobs_db
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.reconciler import Reconciler, ReconcileSettings, Summary
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import balances, job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import one, usage_status


@pytest.fixture
def poisoned_users(db: sa.Engine) -> Iterator[set[uuid.UUID]]:
    """Users whose balance cannot move: any UPDATE of their user_credits row raises in the server."""
    users: set[uuid.UUID] = set()
    with db.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS poisoned_users (user_id uuid PRIMARY KEY)")
        conn.exec_driver_sql(
            """
            CREATE OR REPLACE FUNCTION poison_balance() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF EXISTS (SELECT 1 FROM poisoned_users p WHERE p.user_id = NEW.user_id) THEN
                RAISE EXCEPTION 'numeric field overflow' USING ERRCODE = '22003';
              END IF;
              RETURN NEW;
            END $$
            """
        )
        conn.exec_driver_sql(
            "CREATE OR REPLACE TRIGGER poison_balance BEFORE UPDATE ON user_credits "
            "FOR EACH ROW EXECUTE FUNCTION poison_balance()"
        )
    try:
        yield users
    finally:
        with db.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS poison_balance ON user_credits")
            conn.exec_driver_sql("DROP FUNCTION IF EXISTS poison_balance()")
            conn.exec_driver_sql("DROP TABLE IF EXISTS poisoned_users")


def _poison(db: sa.Engine, user: uuid.UUID) -> None:
    with db.begin() as conn:
        conn.execute(sa.text("INSERT INTO poisoned_users (user_id) VALUES (:u)"), {"u": str(user)})


def _job(db, sandbox, kind, scenario, *, attempts=0, task=True, poisoned=False):
    user = make_user(db, sub=100, topup=50)
    task_id = sandbox.add_task(kind, scenario) if task else None
    job = make_job(
        db,
        user,
        provider_kind=kind,
        provider_task_id=task_id,
        started_minutes_ago=KINDS[kind].stale_threshold.total_seconds() / 60 + 1,
        reconcile_attempts=attempts,
    )
    reserve(db, job, user, 30, from_sub=20, from_topup=10)
    if poisoned:
        _poison(db, user)
    return user, job


def _reconciler(db: sa.Engine, media_dir: str) -> Reconciler:
    settings = ReconcileSettings(cadence=timedelta(seconds=0), concurrency=4)
    return Reconciler(db, providers_from_env(), LocalMediaStore(base_dir=media_dir), settings=settings)


def _claim(db: sa.Engine, jobs: list[uuid.UUID], owner: str) -> list[uuid.UUID]:
    with db.begin() as conn:
        rows = jobs_db.load_jobs(conn, jobs)
        won = jobs_db.claim_jobs(
            conn,
            [jobs_db.Claim(r.id, r.reconcile_attempts) for r in rows],
            owner,
            ReconcileSettings().lease_ttl,
        )
    return [c.job_id for c in won]


def _anomalies(db: sa.Engine, job: uuid.UUID) -> list[str]:
    with db.connect() as conn:
        return list(
            conn.execute(
                sa.text("SELECT reason FROM credit_anomalies WHERE job_id = :j ORDER BY reason"),
                {"j": str(job)},
            ).scalars()
        )


def test_a_force_fail_that_raises_is_an_error_outcome_and_the_batch_keeps_every_outcome(
    db, media_dir, sandbox, poisoned_users
):
    bad_user, bad = _job(
        db, sandbox, "kie-standard", Scenario(outcome="run_forever"), attempts=MAX_ATTEMPTS - 1, poisoned=True
    )
    fail_user, failing = _job(db, sandbox, "kie-standard", Scenario(outcome="fail", polls_before_done=0))
    _, running = _job(db, sandbox, "kie-standard", Scenario(outcome="run_forever"))
    batch = [bad, failing, running]
    rec = _reconciler(db, media_dir)

    for tick in range(3):  # the bad job is due again every tick: it must never climb or raise
        owner = f"run-{tick}"
        claimed = _claim(db, [bad] if tick else batch, owner)
        outcomes = rec.reconcile_many(claimed, owner)

        assert len(outcomes) == len(claimed)
        by_job = {o.job_id: o for o in outcomes}
        assert by_job[bad].outcome is Outcome.ERROR
        assert "IntegrityError" in by_job[bad].detail or "overflow" in by_job[bad].detail
        row = job_row(db, bad)
        assert row["status"] == "processing"
        assert row["reconcile_attempts"] == MAX_ATTEMPTS, "a job whose force-fail raises climbed past the cap"
        assert row["reconcile_lease_owner"] is None  # released: due again at the cadence, not held
        assert usage_status(db, bad) == "reserved"
        assert _anomalies(db, bad) == ["reconcile_settle_error"]
        if tick == 0:
            assert by_job[failing].outcome is Outcome.FAILED
            assert by_job[running].outcome is Outcome.STILL_RUNNING
            summary = Summary(scanned=3).add(outcomes)
            assert (summary.failed, summary.errors, summary.still_running) == (1, 1, 1)

    assert balances(db, bad_user) == (Decimal(80), Decimal(40))  # untouched while the refund fails
    assert job_row(db, failing)["status"] == "failed"
    assert balances(db, fail_user) == (Decimal(100), Decimal(50))
    details = one(
        db,
        "SELECT details::text FROM credit_anomalies WHERE job_id = :j AND reason = 'reconcile_settle_error'",
        j=bad,
    )
    assert "force_fail" in details


@pytest.mark.parametrize("path", ["fail", "sweep"])
def test_a_fail_or_sweep_that_raises_is_counted_once_with_an_anomaly(
    db, media_dir, sandbox, poisoned_users, path
):
    if path == "fail":
        _, bad = _job(
            db, sandbox, "kie-standard", Scenario(outcome="fail", polls_before_done=0), poisoned=True
        )
    else:
        _, bad = _job(db, sandbox, "kie-standard", None, task=False, poisoned=True)
    _, good = _job(db, sandbox, "kie-standard", Scenario(outcome="fail", polls_before_done=0))
    rec = _reconciler(db, media_dir)

    outcomes = rec.reconcile_many(_claim(db, [bad, good], "run-a"), "run-a")

    by_job = {o.job_id: o for o in outcomes}
    assert by_job[bad].outcome is Outcome.ERROR
    assert by_job[good].outcome is Outcome.FAILED
    row = job_row(db, bad)
    assert row["status"] == "processing" and row["reconcile_attempts"] == 1
    assert path in row["reconcile_last_error"]
    assert _anomalies(db, bad) == ["reconcile_settle_error"]
    assert one(db, "SELECT count(*) FROM reconcile_events WHERE job_id = :j", j=bad) == 1


def test_sweep_stale_returns_every_outcome_when_one_sweep_raises(db, media_dir, sandbox, poisoned_users):
    _, bad = _job(db, sandbox, "kie-standard", None, task=False, poisoned=True, attempts=MAX_ATTEMPTS - 1)
    _, good = _job(db, sandbox, "kie-standard", None, task=False)
    rec = _reconciler(db, media_dir)

    scanned, outcomes = rec.sweep_stale("sweep-run")

    assert scanned == 2
    assert {o.job_id: o.outcome for o in outcomes} == {bad: Outcome.ERROR, good: Outcome.SWEPT}
    assert job_row(db, bad)["reconcile_attempts"] == MAX_ATTEMPTS
    assert _anomalies(db, bad) == ["reconcile_settle_error"]


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_batch_is_worked_on_the_calling_thread_only_at_concurrency_one(db, media_dir, sandbox, concurrency):
    jobs = [
        _job(db, sandbox, "kie-standard", Scenario(outcome="fail", polls_before_done=0))[1],
        _job(db, sandbox, "kie-standard", Scenario(outcome="run_forever"))[1],
        _job(db, sandbox, "kie-standard", Scenario(outcome="run_forever"))[1],
    ]
    threads: list[threading.Thread] = []
    settings = ReconcileSettings(cadence=timedelta(seconds=0), concurrency=concurrency)
    rec = Reconciler(
        db,
        providers_from_env(),
        LocalMediaStore(base_dir=media_dir),
        settings=settings,
        on_outcome=lambda _o: threads.append(threading.current_thread()),
    )
    owner = f"threads-{concurrency}"
    claimed = _claim(db, jobs, owner)
    outcomes = rec.reconcile_many(claimed, owner)

    # Every job keeps its outcome, in the batch's order, whichever threads worked it.
    assert sorted(claimed) == sorted(jobs)
    assert [o.job_id for o in outcomes] == claimed
    by_job = {o.job_id: o.outcome for o in outcomes}
    assert [by_job[j] for j in jobs] == [Outcome.FAILED, Outcome.STILL_RUNNING, Outcome.STILL_RUNNING]
    on_caller = [t is threading.main_thread() for t in threads]
    assert on_caller == [concurrency == 1] * len(jobs)
