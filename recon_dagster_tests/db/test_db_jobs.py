"""The jobs table layer against a real PostgreSQL: the stale scan, the reconcile lease, attempt
counting, in-flight counts and loads (guarded transitions: test_db_transitions.py)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.jobs import Claim
from recon_dagster_tests.support.factories import job_row, make_job, sql

TTL = timedelta(minutes=10)


def scan(bind: sa.Engine, limit: int = 500) -> list[jobs_db.JobRow]:
    with bind.begin() as conn:
        return jobs_db.scan_stale(conn, limit=limit)


def scanned_ids(bind: sa.Engine, limit: int = 500) -> list[uuid.UUID]:
    return [r.id for r in scan(bind, limit)]


def claim(bind: sa.Engine, claims: list[Claim], owner: str, ttl: timedelta = TTL) -> list[Claim]:
    with bind.begin() as conn:
        return jobs_db.claim_jobs(conn, claims, owner, ttl)


def expire_lease(bind: sa.Engine, job_id: uuid.UUID) -> None:
    sql(
        bind,
        "UPDATE jobs SET reconcile_lease_expires_at = now() - interval '1 second' WHERE id = :id",
        id=job_id,
    )


# ---------------------------------------------------------------------------------------------
# The stale scan
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "due_minutes", "fresh_minutes"),
    [
        ("kie-standard", 11, 9),
        ("kie-lip-sync", 76, 74),
        ("replicate-training", 31, 29),
        ("kie-veo", 26, 24),
        ("replicate-prediction", 21, 19),
        ("elevenlabs-async", 16, 14),
        ("anthropic-sync", 6, 4),
    ],
)
def test_stale_scan_applies_each_kinds_threshold(
    db: sa.Engine, user: uuid.UUID, kind: str, due_minutes: float, fresh_minutes: float
) -> None:
    due = make_job(db, user, provider_kind=kind, provider_task_id="t-due", started_minutes_ago=due_minutes)
    make_job(db, user, provider_kind=kind, provider_task_id="t-fresh", started_minutes_ago=fresh_minutes)

    assert scanned_ids(db) == [due]


def test_a_lip_sync_row_is_not_swept_at_the_standard_threshold(db: sa.Engine, user: uuid.UUID) -> None:
    # 30 minutes is past every short threshold but well inside lip-sync's 75.
    make_job(db, user, provider_kind="kie-lip-sync", provider_task_id="t", started_minutes_ago=30)
    short = make_job(db, user, provider_kind="kie-standard", provider_task_id="u", started_minutes_ago=30)

    assert scanned_ids(db) == [short]


@pytest.fixture(autouse=True)
def five_minute_precall_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the scan's mechanics (order, limit, lease, cadence): a pre-call budget
    of 5 minutes keeps their rows with no provider call time small. The 3-hour default and what it
    protects are pinned in test_money_rules.py."""
    monkeypatch.setenv("RECON_PRECALL_BUDGET_S", "300")


def test_legacy_rows_without_kind_or_call_time_are_due_after_the_precall_budget_by_created_at(
    db: sa.Engine, user: uuid.UUID
) -> None:
    old = make_job(db, user, created_minutes_ago=6)
    make_job(db, user, created_minutes_ago=4)

    rows = scan(db)

    assert [r.id for r in rows] == [old]
    assert rows[0].provider_kind is None
    assert rows[0].provider_call_started_at is None


def test_legacy_row_is_aged_by_started_at_when_the_worker_set_it(db: sa.Engine, user: uuid.UUID) -> None:
    # Created long ago but dequeued a minute ago: not stuck yet.
    job = make_job(db, user, created_minutes_ago=60)
    sql(db, "UPDATE jobs SET started_at = now() - interval '1 minute' WHERE id = :id", id=job)
    assert scanned_ids(db) == []

    sql(db, "UPDATE jobs SET started_at = now() - interval '6 minutes' WHERE id = :id", id=job)
    assert scanned_ids(db) == [job]


def test_unknown_kind_falls_back_to_five_minutes_and_does_not_crash(db: sa.Engine, user: uuid.UUID) -> None:
    weird = make_job(db, user, provider_kind="weird-kind", provider_task_id="w", started_minutes_ago=6)
    make_job(db, user, provider_kind="weird-kind", provider_task_id="v", started_minutes_ago=4)
    normal = make_job(db, user, provider_kind="kie-standard", provider_task_id="k", started_minutes_ago=11)

    rows = scan(db)

    assert [r.id for r in rows] == [normal, weird]
    assert rows[1].provider_kind == "weird-kind"
    with db.begin() as conn:
        counts = {c["provider_kind"]: c for c in jobs_db.inflight_counts(conn)}
    assert counts["weird-kind"]["inflight"] == 2
    assert counts["weird-kind"]["stale"] == 1


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_terminal_rows_are_never_returned(db: sa.Engine, user: uuid.UUID, status: str) -> None:
    make_job(
        db, user, status=status, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=500
    )
    make_job(db, user, status=status, created_minutes_ago=500)

    assert scan(db) == []


def test_pending_rows_are_scanned_like_processing_ones(db: sa.Engine, user: uuid.UUID) -> None:
    # Spec 5.8: a sync route crash before the pending -> processing flip must still surface.
    pending = make_job(db, user, status="pending", provider_kind="kie-llm", started_minutes_ago=6)

    assert scanned_ids(db) == [pending]


def test_scan_returns_oldest_first_across_timed_and_legacy_rows(db: sa.Engine, user: uuid.UUID) -> None:
    b = make_job(db, user, provider_kind="kie-standard", provider_task_id="b", started_minutes_ago=40)
    d = make_job(db, user, created_minutes_ago=20)
    a = make_job(db, user, provider_kind="kie-veo", provider_task_id="a", started_minutes_ago=50)
    c = make_job(db, user, created_minutes_ago=30)
    e = make_job(db, user, provider_kind="replicate-prediction", provider_task_id="e", started_minutes_ago=21)

    # e's call started 21 minutes ago: older than d, created 20 minutes ago.
    assert scanned_ids(db) == [a, b, c, e, d]


def test_scan_respects_limit_and_keeps_the_oldest_timed_rows(db: sa.Engine, user: uuid.UUID) -> None:
    # Inserted newest first, so physical order disagrees with age.
    ids = [
        make_job(db, user, provider_kind="kie-standard", provider_task_id=f"t{m}", started_minutes_ago=m)
        for m in (11, 12, 13, 14, 15)
    ]

    assert scanned_ids(db, limit=2) == [ids[4], ids[3]]
    assert len(scanned_ids(db, limit=500)) == 5


def test_scan_respects_limit_and_keeps_the_oldest_legacy_rows(db: sa.Engine, user: uuid.UUID) -> None:
    # Inserted newest first, so physical (and index-tie) order disagrees with age: the scan must
    # still hand the reconciler the oldest rows, not whichever it met first.
    ids = [make_job(db, user, created_minutes_ago=m) for m in (6, 7, 8, 9, 10)]

    assert scanned_ids(db, limit=2) == [ids[4], ids[3]]


def test_leased_rows_are_skipped_until_the_lease_expires(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20)
    legacy = make_job(db, user, created_minutes_ago=20)
    assert len(claim(db, [Claim(job, 0), Claim(legacy, 0)], "run-a")) == 2

    assert scan(db) == []

    expire_lease(db, job)
    expire_lease(db, legacy)
    assert set(scanned_ids(db)) == {job, legacy}


def test_rows_waiting_out_the_cadence_are_not_due(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20)
    legacy = make_job(db, user, created_minutes_ago=20)
    for j in (job, legacy):
        sql(db, "UPDATE jobs SET reconcile_next_at = now() + interval '5 minutes' WHERE id = :id", id=j)
    assert scan(db) == []

    for j in (job, legacy):
        sql(db, "UPDATE jobs SET reconcile_next_at = now() - interval '1 second' WHERE id = :id", id=j)
    assert set(scanned_ids(db)) == {job, legacy}


def test_scan_row_carries_what_reconciliation_reads(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(
        db,
        user,
        provider_kind="kie-veo",
        provider_task_id="veo-1",
        started_minutes_ago=30,
        reconcile_attempts=3,
        should_watermark=True,
        is_public=False,
        node_id="n1",
    )

    (row,) = scan(db)

    assert (row.id, row.user_id, row.provider_kind, row.provider_task_id) == (job, user, "kie-veo", "veo-1")
    assert (row.reconcile_attempts, row.should_watermark, row.is_public, row.node_id) == (
        3,
        True,
        False,
        "n1",
    )
    assert row.inflight
    assert not hasattr(row, "usage_log_id")  # spec D7: the reservation is found by job id


def test_stale_scan_uses_the_inflight_index(db: sa.Engine, user: uuid.UUID) -> None:
    with db.begin() as conn:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            conn.execute(sa.text("EXPLAIN " + jobs_db.stale_scan_sql()), {"limit": 10}).scalars()
        )
    assert "jobs_inflight_idx" in plan


# ---------------------------------------------------------------------------------------------
# The reconcile lease
# ---------------------------------------------------------------------------------------------


def test_claim_with_the_scanned_attempt_wins_and_sets_the_lease(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20)
    (row,) = scan(db)

    won = claim(db, [Claim(row.id, row.reconcile_attempts)], "run-a")

    assert won == [Claim(job, 0)]
    r = job_row(db, job)
    assert r["reconcile_lease_owner"] == "run-a"
    assert r["reconcile_lease_expires_at"] is not None
    with db.begin() as conn:
        expires_in = conn.execute(
            sa.text("SELECT reconcile_lease_expires_at - now() FROM jobs WHERE id = :id"), {"id": str(job)}
        ).scalar_one()
    assert timedelta(minutes=9) < expires_in <= TTL


def test_second_owner_loses_while_the_lease_is_live(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20)
    assert claim(db, [Claim(job, 0)], "run-a") == [Claim(job, 0)]

    assert claim(db, [Claim(job, 0)], "run-b") == []

    r = job_row(db, job)
    assert (r["reconcile_lease_owner"], r["reconcile_attempts"]) == ("run-a", 0)


def test_expired_lease_goes_to_another_owner_and_counts_a_failed_attempt(
    db: sa.Engine, user: uuid.UUID
) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20)
    claim(db, [Claim(job, 0)], "run-a")
    expire_lease(db, job)

    won = claim(db, [Claim(job, 0)], "run-b")

    assert won == [Claim(job, 1)]
    r = job_row(db, job)
    assert r["reconcile_lease_owner"] == "run-b"
    assert r["reconcile_attempts"] == 1
    assert "run-a" in r["reconcile_last_error"]


def test_same_owner_reclaiming_does_not_bump(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20)
    claim(db, [Claim(job, 0)], "run-a")

    assert claim(db, [Claim(job, 0)], "run-a") == [Claim(job, 0)]
    expire_lease(db, job)
    assert claim(db, [Claim(job, 0)], "run-a") == [Claim(job, 0)]

    r = job_row(db, job)
    assert (r["reconcile_attempts"], r["reconcile_last_error"]) == (0, None)


def test_claim_with_a_stale_attempt_number_loses(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20)
    other = make_job(db, user, provider_kind="kie-standard", provider_task_id="u", started_minutes_ago=20)
    sql(db, "UPDATE jobs SET reconcile_attempts = 2 WHERE id = :id", id=job)

    won = claim(db, [Claim(job, 1), Claim(other, 0)], "run-a")

    assert won == [Claim(other, 0)]
    assert job_row(db, job)["reconcile_lease_owner"] is None


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_terminal_rows_cannot_be_claimed(db: sa.Engine, user: uuid.UUID, status: str) -> None:
    job = make_job(db, user, status=status, provider_kind="kie-standard", provider_task_id="t")

    assert claim(db, [Claim(job, 0)], "run-a") == []


def test_claim_of_nothing_is_nothing(db: sa.Engine) -> None:
    assert claim(db, [], "run-a") == []


def test_renew_lease_only_for_the_owner_of_an_inflight_row(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20)
    claim(db, [Claim(job, 0)], "run-a", ttl=timedelta(seconds=5))

    with db.begin() as conn:
        assert jobs_db.renew_lease(conn, job, "run-b", TTL) is None
        renewed = jobs_db.renew_lease(conn, job, "run-a", TTL)
        assert renewed is not None
        assert renewed.reconcile_lease_owner == "run-a"
        left = conn.execute(
            sa.text("SELECT reconcile_lease_expires_at - now() FROM jobs WHERE id = :id"), {"id": str(job)}
        ).scalar_one()
        assert left > timedelta(minutes=9)
        assert jobs_db.cancel_job(conn, job)
        assert jobs_db.renew_lease(conn, job, "run-a", TTL) is None


def test_release_lease_only_by_its_owner(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20)
    claim(db, [Claim(job, 0)], "run-a")

    with db.begin() as conn:
        assert not jobs_db.release_lease(conn, job, "run-b")
        assert jobs_db.release_lease(conn, job, "run-a")
        assert not jobs_db.release_lease(conn, job, "run-a")

    r = job_row(db, job)
    assert (r["reconcile_lease_owner"], r["reconcile_lease_expires_at"], r["reconcile_attempts"]) == (
        None,
        None,
        0,
    )
    # Released, not expired: the next claim by another run is not a failed attempt.
    assert claim(db, [Claim(job, 0)], "run-b") == [Claim(job, 0)]


# ---------------------------------------------------------------------------------------------
# bump_attempts
# ---------------------------------------------------------------------------------------------


def test_bump_is_a_cas_on_the_expected_attempt(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20)
    claim(db, [Claim(job, 0)], "run-a")

    with db.begin() as conn:
        first = jobs_db.bump_attempts(
            conn,
            job,
            expected_attempts=0,
            last_error="still running",
            next_in=timedelta(minutes=5),
            owner="run-a",
        )
        second = jobs_db.bump_attempts(
            conn, job, expected_attempts=0, last_error="again", next_in=timedelta(minutes=5), owner="run-a"
        )
        next_in = conn.execute(
            sa.text("SELECT reconcile_next_at - now() FROM jobs WHERE id = :id"), {"id": str(job)}
        ).scalar_one()

    assert (first, second) == (1, None)
    r = job_row(db, job)
    assert r["reconcile_attempts"] == 1
    assert r["reconcile_last_error"] == "still running"
    assert (r["reconcile_lease_owner"], r["reconcile_lease_expires_at"]) == (None, None)
    assert timedelta(minutes=4) < next_in <= timedelta(minutes=5)
    assert r["status"] == "processing"
    # Waiting out the cadence: not due although long past its threshold.
    assert scan(db) == []


def test_bump_by_a_run_that_lost_its_lease_does_nothing(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t", started_minutes_ago=20)
    claim(db, [Claim(job, 0)], "run-b")

    with db.begin() as conn:
        assert (
            jobs_db.bump_attempts(
                conn, job, expected_attempts=0, last_error="x", next_in=timedelta(minutes=5), owner="run-a"
            )
            is None
        )
    assert job_row(db, job)["reconcile_lease_owner"] == "run-b"


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_bump_on_a_terminal_row_returns_none(db: sa.Engine, user: uuid.UUID, status: str) -> None:
    job = make_job(db, user, status=status, provider_kind="kie-standard", provider_task_id="t")

    with db.begin() as conn:
        got = jobs_db.bump_attempts(
            conn, job, expected_attempts=0, last_error="x", next_in=timedelta(minutes=5)
        )

    assert got is None
    assert job_row(db, job)["reconcile_attempts"] == 0


# ---------------------------------------------------------------------------------------------
# inflight_counts, load_job(s)
# ---------------------------------------------------------------------------------------------


def test_inflight_counts_shape(db: sa.Engine, user: uuid.UUID) -> None:
    make_job(db, user, provider_kind="kie-standard", provider_task_id="a", started_minutes_ago=11)
    make_job(db, user, provider_kind="kie-standard", provider_task_id="b", started_minutes_ago=1)
    leased = make_job(
        db,
        user,
        provider_kind="kie-standard",
        provider_task_id="c",
        started_minutes_ago=30,
        reconcile_attempts=4,
    )
    make_job(db, user, created_minutes_ago=10)
    make_job(
        db, user, status="completed", provider_kind="kie-veo", provider_task_id="d", started_minutes_ago=90
    )
    claim(db, [Claim(leased, 4)], "run-a")

    with db.begin() as conn:
        counts = jobs_db.inflight_counts(conn)

    assert counts == [
        {"provider_kind": "(none)", "inflight": 1, "stale": 1, "leased": 0, "max_attempts": 0},
        {"provider_kind": "kie-standard", "inflight": 3, "stale": 2, "leased": 1, "max_attempts": 4},
    ]


def test_inflight_counts_of_an_empty_table(db: sa.Engine) -> None:
    with db.begin() as conn:
        assert jobs_db.inflight_counts(conn) == []


def test_load_job_and_load_jobs(db: sa.Engine, user: uuid.UUID) -> None:
    a = make_job(db, user, provider_kind="kie-standard", provider_task_id="a")
    b = make_job(db, user, status="completed")

    with db.begin() as conn:
        assert jobs_db.load_job(conn, a).provider_task_id == "a"  # type: ignore[union-attr]
        assert jobs_db.load_job(conn, str(b)).status == "completed"  # type: ignore[union-attr]
        assert jobs_db.load_job(conn, uuid.uuid4()) is None
        assert {r.id for r in jobs_db.load_jobs(conn, [a, b, uuid.uuid4()])} == {a, b}
        assert jobs_db.load_jobs(conn, []) == []
