"""Retention of our own tables, on a real PostgreSQL: what a prune pass deletes, every guard that
keeps a row, the per-job summary explain shows, and that a batch never makes an app write wait."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from recon_dagster.db.retention import Cutoffs, Horizons, Pruned, cutoffs, prune_batch, prune_pass, pruned_of
from recon_dagster.operator.explain import JobNotFound, load_story, to_text
from recon_dagster_tests.support.factories import make_job, make_user, reserve, sql

DAY = 86_400.0
NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)


def _cuts(at: datetime) -> Cutoffs:
    return Cutoffs(events=at, decisions=at, creates=at, tombstones=at - timedelta(days=3650), poll_answers=at)


def _event(db: sa.Engine, job: uuid.UUID, days_ago: float, attempt: int = 1, outcome: str = "failed") -> None:
    sql(
        db,
        "INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome, detail, run_id, created_at) "
        "VALUES (:j, 'kie-standard', :a, :o, 'x', :r, now() - make_interval(secs => :s))",
        j=str(job), a=attempt, o=outcome, r=f"run-{attempt}", s=days_ago * DAY,
    )  # fmt: skip


def _decision(db: sa.Engine, job: uuid.UUID, days_ago: float) -> None:
    sql(
        db,
        "INSERT INTO reconcile_decisions (job_id, provider_kind, attempt, action, created_at) "
        "VALUES (:j, 'kie-standard', 1, 'fail', now() - make_interval(secs => :s))",
        j=str(job), s=days_ago * DAY,
    )  # fmt: skip


def _create(
    db: sa.Engine,
    job: uuid.UUID,
    days_ago: float,
    *,
    seq: int = 1,
    state: str = "created",
    fate: str | None = "attached",
) -> None:
    sql(
        db,
        "INSERT INTO upstream_creates (id, job_id, seq, provider, provider_kind, marker, fingerprint, state, "
        "task_id, fate, intent_at) VALUES (:id, :j, :seq, 'kie', 'kie-standard', '', 'f', :st, :t, :fate, "
        "now() - make_interval(secs => :s))",
        id=str(uuid.uuid4()), j=str(job), seq=seq, st=state, t=f"task-{job}-{seq}", fate=fate, s=days_ago * DAY,
    )  # fmt: skip


def _count(db: sa.Engine, table: str, job: uuid.UUID) -> int:
    with db.connect() as conn:
        return int(
            conn.execute(
                sa.text(f"SELECT count(*) FROM {table} WHERE job_id = :j"), {"j": str(job)}
            ).scalar_one()
        )


def _pruned(db: sa.Engine, job: uuid.UUID) -> Pruned | None:
    with db.connect() as conn:
        return pruned_of(conn, str(job))


def _old_cut() -> datetime:
    return datetime.now(UTC) - timedelta(days=30)


@pytest.fixture
def user(db: sa.Engine) -> uuid.UUID:
    return make_user(db)


def test_old_rows_of_a_settled_job_go_and_young_ones_stay(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, status="completed", provider_kind="kie-standard")
    for attempt, days in ((1, 40), (2, 39), (3, 1)):
        _event(db, job, days, attempt)
    _decision(db, job, 40)
    _create(db, job, 40)
    report = prune_pass(db, _cuts(_old_cut()), batch=1000, budget_s=60)
    assert report.deleted["reconcile_events"] == 2
    assert report.deleted["reconcile_decisions"] == 1
    assert report.deleted["upstream_creates"] == 1
    assert _count(db, "reconcile_events", job) == 1  # the young attempt stays


def test_rows_of_a_job_in_flight_are_never_pruned(db: sa.Engine, user: uuid.UUID) -> None:
    """A job still processing after months (a stuck row nobody reconciled): its attempts decide
    its attempt count and its refund."""
    job = make_job(db, user, status="processing", provider_kind="kie-standard")
    _event(db, job, 100)
    _decision(db, job, 100)
    _create(db, job, 100)
    report = prune_pass(db, _cuts(_old_cut()), batch=1000, budget_s=60)
    assert sum(report.deleted.values()) == 0
    assert (_count(db, "reconcile_events", job), _count(db, "reconcile_decisions", job)) == (1, 1)
    assert _count(db, "upstream_creates", job) == 1


def test_rows_of_a_job_with_credits_still_reserved_are_never_pruned(db: sa.Engine, user: uuid.UUID) -> None:
    """A failed job whose refund never happened: the evidence stays until the money settles."""
    job = make_job(db, user, status="failed", provider_kind="kie-standard")
    reserve(db, job, user, 5)
    _event(db, job, 100)
    _create(db, job, 100)
    prune_pass(db, _cuts(_old_cut()), batch=1000, budget_s=60)
    assert (_count(db, "reconcile_events", job), _count(db, "upstream_creates", job)) == (1, 1)


def test_unjudged_creates_and_billed_orphans_are_never_pruned(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, status="failed", provider_kind="kie-standard")
    _create(db, job, 100, seq=1, state="ambiguous", fate=None)  # maybe billed: not judged yet
    _create(db, job, 100, seq=2, state="created", fate="orphan_billed")  # billed for nothing
    _create(db, job, 100, seq=3, state="created", fate="cancelled")  # judged, no money: goes
    report = prune_pass(db, _cuts(_old_cut()), batch=1000, budget_s=60)
    assert report.deleted["upstream_creates"] == 1
    with db.connect() as conn:
        left = conn.execute(sa.text("SELECT seq FROM upstream_creates ORDER BY seq")).scalars().all()
    assert left == [1, 2]


def test_the_ledger_cutoff_keeps_the_orphan_window_and_every_spend_day_not_final() -> None:
    h = Horizons(
        events_s=1 * DAY, decisions_s=1 * DAY, creates_s=1 * DAY, tombstones_s=400 * DAY,
        poll_answers_s=600, orphan_window_s=3 * DAY, spend_final_after_s=2 * DAY,
    )  # fmt: skip
    cuts = cutoffs(NOW, h)
    assert cuts.events == NOW - timedelta(days=1)
    # 2026-06-15 12:00, final after 2 days: 06-12 ends 06-13 00:00 and is final 06-15 00:00, so
    # 06-13 is the oldest day not final (it ends 06-14, final 06-16): nothing from 06-13 on goes.
    assert cuts.creates == datetime(2026, 6, 12, tzinfo=UTC)
    assert cuts.creates <= NOW - timedelta(days=3)  # the orphan sweep's window
    # A longer orphan window binds instead.
    wide = cutoffs(NOW, Horizons(**{**vars(h), "orphan_window_s": 10 * DAY}))
    assert wide.creates == NOW - timedelta(days=10)


def test_an_open_incident_keeps_every_row_since_it_opened() -> None:
    h = Horizons(
        events_s=7 * DAY, decisions_s=7 * DAY, creates_s=14 * DAY, tombstones_s=400 * DAY,
        poll_answers_s=600, orphan_window_s=DAY, spend_final_after_s=DAY,
    )  # fmt: skip
    opened = NOW - timedelta(days=20)
    cuts = cutoffs(NOW, h, open_incident_since=opened)
    assert (cuts.events, cuts.decisions, cuts.creates) == (opened, opened, opened)
    assert cutoffs(NOW, h, open_incident_since=NOW).events == NOW - timedelta(days=7)


def test_explain_of_a_pruned_job_says_what_was_pruned(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, status="failed", provider_kind="kie-standard")
    _event(db, job, 50, 1, "still_running")
    _event(db, job, 49, 2, "failed")
    _create(db, job, 50)
    prune_pass(db, _cuts(_old_cut()), batch=1, budget_s=60)  # one row a batch: the summary adds up
    gone = _pruned(db, job)
    assert gone is not None and (gone.events, gone.creates) == (2, 1)
    assert (gone.last_attempt, gone.last_outcome, gone.last_run_id) == (2, "failed", "run-2")
    text = to_text(load_story(db, job), None)
    assert "never reconciled" not in text
    assert "attempts: 2 pruned" in text
    assert "2 attempt record(s) and 1 create ledger row(s)" in text
    assert "the last: attempt 2, failed (run run-2)" in text
    # The app deleted the job row too: still not "unknown job".
    sql(db, "DELETE FROM jobs WHERE id = :j", j=str(job))
    with pytest.raises(JobNotFound, match="no longer in the jobs table; its history here: 2 attempt"):
        load_story(db, job)


def test_summaries_are_pruned_after_their_own_retention(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, status="completed", provider_kind="kie-standard")
    _event(db, job, 500)
    now = datetime.now(UTC)
    prune_pass(db, _cuts(now - timedelta(days=30)), batch=100, budget_s=60)
    assert _pruned(db, job) is not None
    cuts = Cutoffs(
        events=now, decisions=now, creates=now, tombstones=now - timedelta(days=400), poll_answers=now
    )
    assert prune_pass(db, cuts, batch=100, budget_s=60).deleted["recon_pruned_jobs"] == 1


def test_a_pass_stops_at_its_time_budget_and_the_next_goes_on(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, status="completed", provider_kind="kie-standard")
    for attempt in range(1, 6):
        _event(db, job, 40, attempt)
    ticks = iter(range(100))
    report = prune_pass(db, _cuts(_old_cut()), batch=2, budget_s=2.5, clock=lambda: float(next(ticks)))
    assert not report.finished and report.deleted["reconcile_events"] == 2
    assert prune_pass(db, _cuts(_old_cut()), batch=2, budget_s=60).deleted["reconcile_events"] == 3


def test_poll_answers_of_a_provider_no_longer_polled_are_pruned(db: sa.Engine) -> None:
    sql(
        db,
        "INSERT INTO provider_poll_answers (provider, not_found, at) VALUES ('gone', false, now() - interval '2 days')",
    )
    sql(db, "INSERT INTO provider_poll_answers (provider, not_found, at) VALUES ('kie', false, now())")
    cut = datetime.now(UTC) - timedelta(hours=1)
    assert prune_batch(db, "provider_poll_answers", cut, 100) == 1


def test_a_batch_never_makes_an_app_write_wait(db: sa.Engine, user: uuid.UUID) -> None:
    """While a prune batch's transaction is open (held open here on purpose), the app's writers
    still insert attempts, update the job rows the guards read, and settle credits."""
    jobs = [make_job(db, user, status="completed", provider_kind="kie-standard") for _ in range(20)]
    for job in jobs:
        _event(db, job, 40)
    held = threading.Event()
    release = threading.Event()

    def hold_a_batch() -> None:
        with db.begin() as conn:
            conn.exec_driver_sql("SET LOCAL lock_timeout = '2s'")
            from recon_dagster.db.retention import TABLES

            statement = {t: s for t, s, _ in TABLES}["reconcile_events"]
            conn.execute(sa.text(statement), {"cut": _old_cut(), "n": 10})
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold_a_batch)
    t.start()
    assert held.wait(10)
    try:
        with db.begin() as conn:
            conn.exec_driver_sql("SET LOCAL lock_timeout = '500ms'")  # fails loudly if anything waits
            conn.execute(
                sa.text("UPDATE jobs SET status = 'failed' WHERE id = ANY(CAST(:ids AS uuid[]))"),
                {"ids": [str(j) for j in jobs]},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome) "
                    "SELECT id, 'kie-standard', 9, 'failed' FROM jobs WHERE id = ANY(CAST(:ids AS uuid[]))"
                ),
                {"ids": [str(j) for j in jobs]},
            )
    finally:
        release.set()
        t.join()
    assert prune_pass(db, _cuts(_old_cut()), batch=1000, budget_s=60).deleted["reconcile_events"] == 10


# --- the KIE balance chain (recon_balance_samples) ----------------------------------------------


def _chain(db: sa.Engine, provider: str, days_ago: list[float]) -> list[int]:
    """A chain of samples, oldest first, each measured from the one before (ids in that order)."""
    ids: list[int] = []
    with db.begin() as conn:
        for days in days_ago:
            row = conn.execute(
                sa.text(
                    "INSERT INTO recon_balance_samples (provider, balance, sampled_at, previous_id) "
                    "VALUES (:p, 100, now() - make_interval(secs => :s), :prev) RETURNING id"
                ),
                {"p": provider, "s": days * DAY, "prev": ids[-1] if ids else None},
            )
            ids.append(int(row.scalar_one()))
    return ids


def _samples(db: sa.Engine, provider: str) -> list[tuple[int, int | None]]:
    with db.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT id, previous_id FROM recon_balance_samples WHERE provider = :p ORDER BY id"),
            {"p": provider},
        )
        return [(int(r.id), r.previous_id) for r in rows]


def _sample_cuts(at: datetime) -> Cutoffs:
    far = at - timedelta(days=3650)
    return Cutoffs(
        events=far, decisions=far, creates=far, tombstones=far, poll_answers=far, balance_samples=at
    )


def test_old_balance_samples_go_oldest_first_and_the_chain_stays_whole(db: sa.Engine) -> None:
    """Batches of 2 through a chain of 7, two providers interleaved: the old prefix goes, the
    oldest sample kept becomes the chain's first, and the chain's guard still holds after."""
    from recon_dagster.db import balance_samples

    kie = _chain(db, "kie", [200, 180, 160, 140, 120, 100, 1])
    other = _chain(db, "other", [150, 2])
    report = prune_pass(db, _sample_cuts(datetime.now(UTC) - timedelta(days=30)), batch=2, budget_s=60)
    # kie keeps its head and the sample the head measures from; "other" has nothing old but its
    # head's predecessor, which stays.
    assert report.deleted["recon_balance_samples"] == 5
    assert _samples(db, "kie") == [(kie[5], None), (kie[6], kie[5])]
    assert _samples(db, "other") == [(other[0], None), (other[1], other[0])]
    with db.begin() as conn:
        head = balance_samples.latest(conn, "kie")
        assert head is not None and head.id == kie[6]
        at = datetime.now(UTC)
        assert balance_samples.record(conn, "kie", 90.0, at, None) is None  # still one first per provider
        assert balance_samples.record(conn, "kie", 90.0, at, head) is not None  # the chain goes on


def test_the_head_and_every_sample_a_spend_day_not_final_needs_are_never_pruned(db: sa.Engine) -> None:
    """A head months old (spend not run since) stays, with the sample it measures from; a sample
    of a day not final yet stays with the one its window starts at."""
    lone = _chain(db, "lone", [300, 200])
    kie = _chain(db, "kie", [100, 60, 2, 0.5])
    now = datetime.now(UTC)
    h = Horizons(
        events_s=DAY, decisions_s=DAY, creates_s=DAY, tombstones_s=DAY, poll_answers_s=600,
        orphan_window_s=DAY, spend_final_after_s=DAY, balance_samples_s=DAY,
    )  # fmt: skip
    cuts = cutoffs(now, h)
    assert cuts.balance_samples is not None and cuts.balance_samples <= now - timedelta(days=2)
    # The sample 2 days old is past its 1-day retention but of a day not final yet: it stays, with
    # the one its window starts at (60 days old); only the 100-day-old sample goes.
    report = prune_pass(db, cuts, batch=10, budget_s=60)
    assert report.deleted["recon_balance_samples"] == 1
    assert [i for i, _ in _samples(db, "kie")] == kie[1:]
    assert [i for i, _ in _samples(db, "lone")] == lone
    # An open incident keeps every sample since it opened.
    opened = now - timedelta(days=250)
    assert cutoffs(now, h, open_incident_since=opened).balance_samples == opened
