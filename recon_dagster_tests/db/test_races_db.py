"""Real concurrency on the guarded writes: threads, each with its own connection and transaction.

Every thread opens its transaction, waits at a barrier so all statements fire together, runs its
one write, then holds the transaction open a moment before committing, so the others are queued
on the row lock and must re-check their guard against the winner's committed row (the path a
plain sequential test never takes). A loser's re-check locks the row until it commits, so the
holds add up: keep HOLD_S small.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from decimal import Decimal
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from recon_dagster.db import credits
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.jobs import Claim
from recon_dagster_tests.support.factories import balances, job_row, make_job, make_user, reserve

T = TypeVar("T")
N = 16
ROUNDS = range(5)
HOLD_S = 0.005  # how long a thread keeps its transaction open after its write
JOIN_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def race_engine(engine: sa.Engine) -> Iterator[sa.Engine]:
    """An engine on the test database with a connection for every racing thread (kept between races)."""
    eng = sa.create_engine(engine.url.render_as_string(hide_password=False), pool_size=N, max_overflow=N)
    yield eng
    eng.dispose()


class Raised:
    """A thread's exception, kept as its result so a test can count it."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __repr__(self) -> str:
        return f"Raised({self.exc!r})"


def race(engine: sa.Engine, writers: Sequence[Callable[[sa.Connection], T]]) -> list[T | Raised]:
    """Run each writer in its own thread and transaction, all released at once; results in order."""
    barrier = threading.Barrier(len(writers))
    results: list[Any] = [None] * len(writers)

    def run(i: int) -> None:
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("SELECT 1")  # connected and in a transaction before the start
                barrier.wait(timeout=JOIN_TIMEOUT_S)
                results[i] = writers[i](conn)
                time.sleep(HOLD_S)
        except BaseException as exc:  # reported to the test, never swallowed
            results[i] = Raised(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a racing thread hung"
    return results


def no_errors(results: Sequence[object]) -> None:
    errors = [r for r in results if isinstance(r, Raised)]
    assert errors == [], errors


def complete(job_id: uuid.UUID) -> Callable[[sa.Connection], bool]:
    return lambda conn: jobs_db.complete_job(
        conn, job_id, output_data={"url": "s3://out"}, provider="kie", provider_cost=0.1, display_cost=3
    )


def cancel(job_id: uuid.UUID) -> Callable[[sa.Connection], bool]:
    return lambda conn: jobs_db.cancel_job(conn, job_id)


def fail(job_id: uuid.UUID) -> Callable[[sa.Connection], bool]:
    return lambda conn: jobs_db.fail_job(conn, job_id, "upstream failed")


def refund(job_id: uuid.UUID) -> Callable[[sa.Connection], credits.Refund | None]:
    return lambda conn: credits.refund_reserved_credits_for_job(conn, job_id)


def commit(job_id: uuid.UUID) -> Callable[[sa.Connection], uuid.UUID | None]:
    return lambda conn: credits.commit_job_credits(conn, job_id, 0.5)


def claim_by(owner: str, claims: Sequence[Claim]) -> Callable[[sa.Connection], list[Claim]]:
    return lambda conn: jobs_db.claim_jobs(conn, claims, owner, timedelta(minutes=10))


def record_task(job_id: uuid.UUID, task_id: str) -> Callable[[sa.Connection], str | None]:
    return lambda conn: jobs_db.record_task_created(conn, job_id, "kie-standard", task_id)


def usage_statuses(bind: sa.Engine, job_id: uuid.UUID) -> list[str]:
    with bind.begin() as conn:
        return list(
            conn.execute(
                sa.text("SELECT status FROM usage_logs WHERE job_id = :j"), {"j": str(job_id)}
            ).scalars()
        )


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("round_", ROUNDS)
def test_many_completes_of_one_job_exactly_one_wins(
    db: sa.Engine, race_engine: sa.Engine, round_: int
) -> None:
    job = make_job(db, make_user(db), provider_kind="kie-standard", provider_task_id="t")

    results = race(race_engine, [complete(job)] * N)

    no_errors(results)
    assert results.count(True) == 1
    assert results.count(False) == N - 1
    assert job_row(db, job)["status"] == "completed"


@pytest.mark.parametrize("round_", ROUNDS)
def test_many_refunds_of_one_reservation_move_balances_once(
    db: sa.Engine, race_engine: sa.Engine, round_: int
) -> None:
    user = make_user(db, sub=20, topup=50)
    job = make_job(db, user)
    reserve(db, job, user, 30)  # 20 from subscription, 10 from top-up

    results = race(race_engine, [refund(job)] * N)

    no_errors(results)
    won = [r for r in results if r is not None]
    assert len(won) == 1
    assert (won[0].to_subscription, won[0].to_topup) == (Decimal(20), Decimal(10))  # type: ignore[union-attr]
    assert balances(db, user) == (Decimal(20), Decimal(50))
    assert usage_statuses(db, job) == ["refunded"]


@pytest.mark.parametrize("round_", ROUNDS)
def test_commits_and_refunds_of_one_reservation_exactly_one_wins(
    db: sa.Engine, race_engine: sa.Engine, round_: int
) -> None:
    user = make_user(db, sub=20, topup=50)
    job = make_job(db, user)
    reserve(db, job, user, 30)
    after_reserve = balances(db, user)
    writers: list[Callable[[sa.Connection], object]] = [commit(job)] * (N // 2) + [refund(job)] * (N // 2)
    random.Random(round_).shuffle(writers)

    results = race(race_engine, writers)

    no_errors(results)
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    (status,) = usage_statuses(db, job)
    if isinstance(winners[0], credits.Refund):
        assert status == "refunded"
        assert balances(db, user) == (Decimal(20), Decimal(50))
    else:
        assert status == "committed"
        assert balances(db, user) == after_reserve


@pytest.mark.parametrize("round_", ROUNDS)
def test_complete_and_cancel_never_both_win(db: sa.Engine, race_engine: sa.Engine, round_: int) -> None:
    job = make_job(db, make_user(db), provider_kind="kie-standard", provider_task_id="t")
    writers = [complete(job), cancel(job)] * (N // 2)
    kinds = ["completed", "cancelled"] * (N // 2)

    results = race(race_engine, writers)

    no_errors(results)
    assert results.count(True) == 1
    winner = kinds[results.index(True)]
    r = job_row(db, job)
    assert r["status"] == winner
    # A cancel that lost must not have left the completed row's output behind, nor vice versa.
    assert (r["output_data"] is not None) == (winner == "completed")


@pytest.mark.parametrize("round_", ROUNDS)
def test_complete_fail_and_cancel_three_ways_one_terminal_state(
    db: sa.Engine, race_engine: sa.Engine, round_: int
) -> None:
    job = make_job(db, make_user(db), provider_kind="kie-standard", provider_task_id="t")
    writers = [complete(job), fail(job), cancel(job)] * 5
    kinds = ["completed", "failed", "cancelled"] * 5

    results = race(race_engine, writers)

    no_errors(results)
    assert results.count(True) == 1
    assert job_row(db, job)["status"] == kinds[results.index(True)]


@pytest.mark.parametrize("round_", ROUNDS)
def test_concurrent_claims_give_each_job_exactly_one_owner(
    db: sa.Engine, race_engine: sa.Engine, round_: int
) -> None:
    user = make_user(db)
    jobs = [
        make_job(db, user, provider_kind="kie-standard", provider_task_id=f"t{i}", started_minutes_ago=20 + i)
        for i in range(6)
    ]
    with db.begin() as conn:
        scanned = [Claim(r.id, r.reconcile_attempts) for r in jobs_db.scan_stale(conn)]
    assert {c.job_id for c in scanned} == set(jobs)

    owners = [f"run-{round_}-{i}" for i in range(N)]
    results = race(race_engine, [claim_by(o, scanned) for o in owners])

    no_errors(results)
    won_by: dict[uuid.UUID, list[str]] = {j: [] for j in jobs}
    for owner, won in zip(owners, results, strict=True):
        for c in won:  # type: ignore[union-attr]
            won_by[c.job_id].append(owner)
    assert all(len(w) == 1 for w in won_by.values()), won_by
    for job, (owner,) in won_by.items():
        r = job_row(db, job)
        assert r["reconcile_lease_owner"] == owner
        assert (r["reconcile_attempts"], r["reconcile_last_error"]) == (0, None)


def test_claims_of_overlapping_jobs_in_opposite_orders_do_not_deadlock(
    db: sa.Engine, race_engine: sa.Engine
) -> None:
    # dispatch() claims a tick's batches one after another in one transaction, ordered by kind;
    # sweep_stale() claims in age order. Two such transactions meeting on the same two jobs in
    # opposite orders: each holds one job and asks for the other. A lease claim should skip a job
    # someone else is claiming right now (it will be theirs), not wait for it.
    user = make_user(db)
    a = make_job(db, user, provider_kind="kie-standard", provider_task_id="a", started_minutes_ago=20)
    b = make_job(db, user, provider_kind="kie-standard", provider_task_id="b", started_minutes_ago=21)
    halfway = threading.Barrier(2)

    def two_batches(
        first: uuid.UUID, second: uuid.UUID, owner: str
    ) -> Callable[[sa.Connection], list[Claim]]:
        def run(conn: sa.Connection) -> list[Claim]:
            won = jobs_db.claim_jobs(conn, [Claim(first, 0)], owner, timedelta(minutes=10))
            halfway.wait(timeout=JOIN_TIMEOUT_S)
            return won + jobs_db.claim_jobs(conn, [Claim(second, 0)], owner, timedelta(minutes=10))

        return run

    results = race(race_engine, [two_batches(a, b, "sensor-tick"), two_batches(b, a, "sweep")])

    no_errors(results)
    assert job_row(db, a)["reconcile_lease_owner"] == "sensor-tick"
    assert job_row(db, b)["reconcile_lease_owner"] == "sweep"


@pytest.mark.parametrize("round_", ROUNDS)
def test_concurrent_reservations_never_overdraw(db: sa.Engine, race_engine: sa.Engine, round_: int) -> None:
    user = make_user(db, sub=10, topup=5)
    jobs = [make_job(db, user) for _ in range(N)]

    results = race(
        race_engine, [lambda conn, j=j: credits.reserve_credits_for_job(conn, j, user, 2) for j in jobs]
    )

    ok = [r for r in results if isinstance(r, uuid.UUID)]
    refused = [r for r in results if isinstance(r, Raised) and isinstance(r.exc, credits.InsufficientCredits)]
    assert (len(ok), len(refused)) == (7, N - 7), results
    assert balances(db, user) == (Decimal(0), Decimal(1))


@pytest.mark.parametrize("round_", ROUNDS)
def test_takeover_of_an_expired_lease_counts_the_dead_attempt_once(
    db: sa.Engine, race_engine: sa.Engine, round_: int
) -> None:
    job = make_job(
        db, make_user(db), provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20
    )
    with db.begin() as conn:
        assert jobs_db.claim_jobs(conn, [Claim(job, 0)], "dead-run", timedelta(minutes=10))
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_lease_expires_at = now() - interval '1 second' WHERE id = :id"
            ),
            {"id": str(job)},
        )
    owners = [f"run-{i}" for i in range(N)]

    results = race(
        race_engine,
        [claim_by(o, [Claim(job, 0)]) for o in owners],
    )

    no_errors(results)
    winners = [o for o, won in zip(owners, results, strict=True) if won]
    assert len(winners) == 1
    r = job_row(db, job)
    assert (r["reconcile_lease_owner"], r["reconcile_attempts"]) == (winners[0], 1)
    assert "dead-run" in r["reconcile_last_error"]


@pytest.mark.parametrize("round_", ROUNDS)
def test_many_bumps_of_one_attempt_count_it_once(db: sa.Engine, race_engine: sa.Engine, round_: int) -> None:
    job = make_job(
        db,
        make_user(db),
        provider_kind="kie-standard",
        provider_task_id="t",
        started_minutes_ago=20,
        reconcile_attempts=3,
    )

    results = race(
        race_engine,
        [
            lambda conn: jobs_db.bump_attempts(
                conn, job, expected_attempts=3, last_error="still running", next_in=timedelta(minutes=5)
            )
        ]
        * N,
    )

    no_errors(results)
    assert sorted(results, key=lambda r: r is None) == [4] + [None] * (N - 1)
    assert job_row(db, job)["reconcile_attempts"] == 4


@pytest.mark.parametrize("round_", ROUNDS)
def test_workers_recording_different_tasks_at_once_keep_exactly_one(
    db: sa.Engine, race_engine: sa.Engine, round_: int
) -> None:
    job = make_job(db, make_user(db), status="processing")
    tasks = [f"task-{round_}-{i}" for i in range(N)]

    results = race(
        race_engine,
        [record_task(job, t) for t in tasks],
    )

    no_errors(results)
    persisted = job_row(db, job)["provider_task_id"]
    assert persisted in tasks
    # Every recorder, winner or not, is told the one persisted id (losers resume it).
    assert results == [persisted] * N


@pytest.mark.parametrize("round_", ROUNDS)
def test_claims_racing_a_completion_leave_no_lease_on_the_finished_row(
    db: sa.Engine, race_engine: sa.Engine, round_: int
) -> None:
    job = make_job(
        db, make_user(db), provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20
    )
    writers: list[Callable[[sa.Connection], object]] = [complete(job)] * (N // 2) + [
        claim_by(f"run-{i}", [Claim(job, 0)]) for i in range(N // 2)
    ]
    random.Random(round_).shuffle(writers)

    results = race(race_engine, writers)

    no_errors(results)
    assert results.count(True) == 1
    r = job_row(db, job)
    assert r["status"] == "completed"
    assert (r["reconcile_lease_owner"], r["reconcile_lease_expires_at"]) == (None, None)
