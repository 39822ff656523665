"""Races between worker, reconciler, webhook and user cancel, with real threads on real
PostgreSQL and real HTTP to the sandbox (spec 5.4, section 7)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.media.store import LocalMediaStore, StoredObject
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.finalize import ProviderResult, finalize_job_with_media
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import balances, job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import count, media_policy, one, usage_status


def _finished_job(db, sandbox, kind="kie-standard"):
    user = make_user(db, sub=100, topup=0)
    task = sandbox.add_task(kind, Scenario(polls_before_done=0))
    job = make_job(db, user, provider_kind=kind, provider_task_id=task, started_minutes_ago=30)
    reserve(db, job, user, 10)
    status = providers_from_env().poll(kind, task)
    return user, job, ProviderResult.from_status(status)


@pytest.mark.parametrize("round_", range(5))
def test_worker_and_reconciler_finalize_at_once_one_wins(db, sandbox, media_dir, round_):
    user, job, result = _finished_job(db, sandbox)
    store = LocalMediaStore(base_dir=media_dir)
    barrier = threading.Barrier(4)
    outcomes: list[bool] = []
    lock = threading.Lock()

    def finalize(source: str) -> None:
        barrier.wait()
        res = finalize_job_with_media(db, store, job, result, source=source, policy=media_policy())
        with lock:
            outcomes.append(res.ok)

    threads = [
        threading.Thread(target=finalize, args=(s,)) for s in ("worker", "reconcile", "webhook", "reconcile")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(outcomes) == [False, False, False, True]
    assert job_row(db, job)["status"] == "completed"
    assert usage_status(db, job) == "committed"
    assert count(db, "assets", job) == 1
    assert balances(db, user) == (Decimal(90), Decimal(0))
    files = [p for p in Path(media_dir).rglob("*") if p.is_file()]
    assert len(files) == 1  # same deterministic key: overwritten, never duplicated


class _CancelDuringUpload:
    """A store whose upload gives the user time to cancel: the cancel lands mid-finalize."""

    def __init__(self, inner: LocalMediaStore, engine: sa.Engine, job_id) -> None:
        self.inner, self.engine, self.job_id = inner, engine, job_id

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> StoredObject:
        obj = self.inner.put_stream(key, chunks, content_type)
        with self.engine.begin() as conn:
            assert jobs_db.cancel_job(conn, self.job_id)
        return obj

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_user_cancel_during_finalize_wins(db, sandbox, media_dir):
    _, job, result = _finished_job(db, sandbox)
    store = _CancelDuringUpload(LocalMediaStore(base_dir=media_dir), db, job)

    res = finalize_job_with_media(db, store, job, result, source="reconcile", policy=media_policy())

    assert res.ok is False
    assert job_row(db, job)["status"] == "cancelled"
    assert usage_status(db, job) == "reserved"  # not committed: the app's cancel path settles it
    assert count(db, "assets", job) == 0


def test_webhook_style_second_finalize_is_a_no_op(db, sandbox, media_dir):
    user, job, result = _finished_job(db, sandbox)
    store = LocalMediaStore(base_dir=media_dir)

    first = finalize_job_with_media(db, store, job, result, source="worker", policy=media_policy())
    second = finalize_job_with_media(db, store, job, result, source="webhook", policy=media_policy())

    assert first.ok is True
    assert second.ok is False and second.reason == "already completed"
    assert count(db, "assets", job) == 1
    assert balances(db, user) == (Decimal(90), Decimal(0))
    assert one(db, "SELECT output_data->>'finalized_by' FROM jobs WHERE id = :j", j=job) == "worker"


def test_finalize_never_completes_a_failed_row(db, sandbox, media_dir):
    """The sweep failed and refunded the row; a late worker must not complete it for free."""
    _, job, result = _finished_job(db, sandbox)
    with db.begin() as conn:
        assert jobs_db.fail_job(conn, job, "reconcile_no_recovery")

    res = finalize_job_with_media(
        db, LocalMediaStore(base_dir=media_dir), job, result, source="worker", policy=media_policy()
    )

    assert res.ok is False
    assert job_row(db, job)["status"] == "failed"


# --- the act step's batch read ------------------------------------------------------


def _claimed_and_polled(db, sandbox, n: int, media_dir: str, store=None):
    from recon_dagster.reconcile.batches import next_attempt
    from recon_dagster.reconcile.reconciler import Reconciler

    jobs = [_finished_job(db, sandbox) for _ in range(n)]
    rec = Reconciler(
        db, providers_from_env(), store or LocalMediaStore(base_dir=media_dir), media_policy=media_policy()
    )
    with db.connect() as conn:
        rows = jobs_db.load_jobs(conn, [j for _, j, _ in jobs])
    work, _ = rec.claim([jobs_db.Claim(r.id, next_attempt(r)) for r in rows], "run:batch-read")
    return jobs, rec, rec.poll(work)


def test_the_act_step_reads_its_finalize_rows_in_one_statement_per_batch(db, sandbox, media_dir):
    """Finalize's read (row + reservation) is taken for the whole batch with the lease renewal,
    not once per job: statements per reconciled job drop by one, whatever the batch size."""
    from recon_dagster_tests.support.reconcile import statements_like

    jobs, rec, polled = _claimed_and_polled(db, sandbox, 6, media_dir)
    with statements_like(db, "LEFT JOIN LATERAL") as reads:
        outcomes = rec.act(polled, "run:batch-read")

    assert [o.outcome.value for o in outcomes] == ["recovered"] * 6
    assert len(reads) == 1, reads
    for user, job, _ in jobs:
        assert job_row(db, job)["status"] == "completed"
        assert usage_status(db, job) == "committed"
        assert balances(db, user) == (Decimal(90), Decimal(0))


class _WorkerFinishesFirst:
    """A store whose upload lets the app's worker finalize the same job first: the row the act
    step read for it is stale by the time its settle runs."""

    def __init__(self, inner: LocalMediaStore, engine: sa.Engine, results: dict) -> None:
        self.inner, self.engine, self.results = inner, engine, results
        self.won: list[bool] = []

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> StoredObject:
        obj = self.inner.put_stream(key, chunks, content_type)
        job = next(j for j in self.results if str(j) in key)
        res = finalize_job_with_media(
            self.engine, self.inner, job, self.results[job], source="worker", policy=media_policy()
        )
        self.won.append(res.ok)
        return obj

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_job_another_writer_finishes_after_the_batch_read_is_settled_once(db, sandbox, media_dir):
    """The batch read decides nothing final: a row the worker completed after it loses the
    guarded settle, so its credits are committed once, one asset, and the media the winner
    references (the same task's key) stays."""
    inner = LocalMediaStore(base_dir=media_dir)
    store = _WorkerFinishesFirst(inner, db, {})
    jobs, rec, polled = _claimed_and_polled(db, sandbox, 3, media_dir, store=store)
    store.results.update({job: result for _, job, result in jobs})

    outcomes = rec.act(polled, "run:batch-read")

    assert store.won == [True, True, True]  # the worker won every one
    assert sorted(o.outcome.value for o in outcomes) == ["lost_race"] * 3
    for user, job, _ in jobs:
        row = job_row(db, job)
        assert row["status"] == "completed" and row["output_data"]["finalized_by"] == "worker"
        assert usage_status(db, job) == "committed"
        assert count(db, "assets", job) == 1
        assert balances(db, user) == (Decimal(90), Decimal(0))
        key = row["output_data"]["media"][0]["key"]
        assert inner.exists(key)
