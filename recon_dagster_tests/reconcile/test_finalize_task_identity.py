"""Two finalizes of one job with different upstream results (the persisted task and an orphan
duplicate, or a stray webhook) never mix: a result from a task other than the row's is refused
before any download, and a losing finalize never changes an object the winner references.
Real PostgreSQL, real HTTP to the sandbox, a real media folder."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable

import pytest
import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.media.store import LocalMediaStore, StoredObject
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile import finalize as finalize_mod
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.finalize import ProviderResult, finalize_job_with_media
from recon_dagster.reconcile.reconciler import Reconciler
from recon_dagster.sandbox import Scenario, media_digest
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import count, media_policy, one, stored_files, usage_status

KIND = "kie-veo"
SIZE = 8192


def _task(sandbox) -> tuple[str, ProviderResult]:
    task = sandbox.add_task(KIND, Scenario(polls_before_done=0, media_size=SIZE))
    return task, ProviderResult.from_status(providers_from_env().poll(KIND, task))


def _job(db: sa.Engine, task: str | None) -> uuid.UUID:
    user = make_user(db)
    job = make_job(
        db, user, job_type="video", provider_kind=KIND, provider_task_id=task, started_minutes_ago=30
    )
    reserve(db, job, user, 10)
    return job


class _Hooked:
    """A store that runs ``before`` once before this finalize's first upload, and ``after`` once
    after its last: another finalize runs to its end right there."""

    def __init__(
        self, inner: LocalMediaStore, before: Callable[[], None] | None, after: Callable[[], None] | None
    ) -> None:
        self.inner, self.before, self.after = inner, before, after

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> StoredObject:
        if self.before is not None:
            hook, self.before = self.before, None
            hook()
        obj = self.inner.put_stream(key, chunks, content_type)
        if self.after is not None:
            hook, self.after = self.after, None
            hook()
        return obj

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


_files = stored_files


def _assert_store_is_the_winners(
    db: sa.Engine, job: uuid.UUID, media_dir: str, tasks: dict[str, str]
) -> None:
    """The row completed with one task's result; every stored object is that task's bytes, as
    ``output_data`` and the asset record them, and nothing else is left in the store."""
    row = job_row(db, job)
    assert row["status"] == "completed"
    winner = row["output_data"]["provider_task_id"]
    assert winner in tasks.values()
    recorded = {m["key"]: m["sha256"] for m in row["output_data"]["media"]}
    assert recorded and set(recorded.values()) == {media_digest(winner, 0, "video", SIZE)}
    assert _files(media_dir) == recorded
    asset_key = one(db, "SELECT storage_key FROM assets WHERE job_id = :j", j=job)
    assert asset_key in recorded
    assert usage_status(db, job) == "committed"


def _finalize(db, store, job, result, source):
    return finalize_job_with_media(db, store, job, result, source=source, policy=media_policy())


# --- a result from another task than the row's ------------------------------------------------


def test_a_result_from_another_task_than_the_rows_is_refused_with_an_anomaly_and_nothing_stored(
    db, sandbox, media_dir
):
    own, own_result = _task(sandbox)
    orphan, orphan_result = _task(sandbox)
    job = _job(db, own)

    with pytest.raises(finalize_mod.UnusableResult) as refused:
        _finalize(db, LocalMediaStore(base_dir=media_dir), job, orphan_result, "webhook")

    assert own in str(refused.value) and orphan in str(refused.value)
    row = job_row(db, job)
    assert row["status"] == "processing" and row["output_data"] is None
    assert usage_status(db, job) == "reserved"
    assert count(db, "assets", job) == 0
    assert _files(media_dir) == {}
    details = one(
        db, "SELECT details FROM credit_anomalies WHERE job_id = :j AND reason = 'foreign_task_result'", j=job
    )
    assert details["row_task_id"] == own and details["result_task_id"] == orphan
    # The row's own task still completes it, with its own bytes.
    assert _finalize(db, LocalMediaStore(base_dir=media_dir), job, own_result, "worker").ok
    _assert_store_is_the_winners(db, job, media_dir, {"own": own})


def test_a_foreign_result_is_refused_before_any_download(db, sandbox, media_dir, monkeypatch):
    own, _ = _task(sandbox)
    _, orphan_result = _task(sandbox)
    job = _job(db, own)
    fetched: list[str] = []
    monkeypatch.setattr(finalize_mod, "fetch_media_to_store", lambda url, *a, **k: fetched.append(url))

    with pytest.raises(finalize_mod.UnusableResult):
        _finalize(db, LocalMediaStore(base_dir=media_dir), job, orphan_result, "webhook")

    assert fetched == []


def test_a_row_given_its_task_between_read_and_settle_refuses_another_tasks_result(db, sandbox, media_dir):
    """The row had no task when the stray finalize read it; the worker persisted its own before the
    settle: the guarded completion refuses the stray result and its media goes."""
    own, own_result = _task(sandbox)
    stray, stray_result = _task(sandbox)
    job = _job(db, None)

    def worker_persists_its_task() -> None:
        with db.begin() as conn:
            assert jobs_db.record_task_created(conn, job, KIND, own) == own

    store = _Hooked(LocalMediaStore(base_dir=media_dir), None, worker_persists_its_task)
    with pytest.raises(finalize_mod.UnusableResult):
        _finalize(db, store, job, stray_result, "webhook")

    assert job_row(db, job)["status"] == "processing"
    assert usage_status(db, job) == "reserved"
    assert _files(media_dir) == {}
    details = one(
        db, "SELECT details FROM credit_anomalies WHERE job_id = :j AND reason = 'foreign_task_result'", j=job
    )
    assert (details["row_task_id"], details["result_task_id"]) == (own, stray)
    assert _finalize(db, LocalMediaStore(base_dir=media_dir), job, own_result, "worker").ok
    _assert_store_is_the_winners(db, job, media_dir, {"own": own})


def test_the_reconciler_reports_a_foreign_result_as_an_error_and_neither_completes_nor_fails_the_job(
    db, sandbox, media_dir
):
    own, _ = _task(sandbox)
    other, _ = _task(sandbox)
    job = _job(db, own)
    providers = providers_from_env()

    class Misrouted:
        """The provider answers the poll of the row's task with another task's result."""

        def poll(self, kind: str, task_id: str):
            return providers.poll(kind, other)

        def __getattr__(self, name: str):
            return getattr(providers, name)

    rec = Reconciler(db, Misrouted(), LocalMediaStore(base_dir=media_dir), media_policy=media_policy())
    with db.begin() as conn:
        assert jobs_db.claim_jobs(conn, [jobs_db.Claim(job, 0)], "run-1", rec.settings.lease_ttl)

    outcome = rec.reconcile(job, "run-1")

    assert outcome.outcome is Outcome.ERROR
    assert own in outcome.detail and other in outcome.detail
    row = job_row(db, job)
    assert row["status"] == "processing" and row["reconcile_attempts"] == 1
    assert usage_status(db, job) == "reserved"
    assert _files(media_dir) == {}


# --- a loser never changes what the winner references -------------------------------------------


@pytest.mark.parametrize("first", ["a", "b"])
def test_sequential_finalizes_of_two_tasks_leave_only_the_winners_bytes(db, sandbox, media_dir, first):
    a, ra = _task(sandbox)
    b, rb = _task(sandbox)
    job = _job(db, None)
    store = LocalMediaStore(base_dir=media_dir)
    order = [ra, rb] if first == "a" else [rb, ra]

    won = _finalize(db, store, job, order[0], "worker")
    lost = _finalize(db, store, job, order[1], "webhook")

    assert won.ok and not lost.ok
    _assert_store_is_the_winners(db, job, media_dir, {"a": a, "b": b})
    assert job_row(db, job)["output_data"]["provider_task_id"] == order[0].task_id


@pytest.mark.parametrize("when", ["before_upload", "after_upload"])
@pytest.mark.parametrize("loser", ["a", "b"])
def test_a_loser_that_uploads_around_the_winners_commit_never_changes_the_winners_media(
    db, sandbox, media_dir, when, loser
):
    """The loser has read the row (in flight) when the winner runs to its commit: right before the
    loser's upload (the loser uploads after the winner committed), or right after it (the winner
    uploads after the loser, then commits; the loser's settle then loses)."""
    a, ra = _task(sandbox)
    b, rb = _task(sandbox)
    job = _job(db, None)
    plain = LocalMediaStore(base_dir=media_dir)
    lose_with, win_with = (ra, rb) if loser == "a" else (rb, ra)

    def winner_runs() -> None:
        assert _finalize(db, plain, job, win_with, "worker").ok

    hooked = _Hooked(
        plain,
        winner_runs if when == "before_upload" else None,
        winner_runs if when == "after_upload" else None,
    )
    lost = _finalize(db, hooked, job, lose_with, "webhook")

    assert lost.ok is False
    assert job_row(db, job)["output_data"]["provider_task_id"] == win_with.task_id
    _assert_store_is_the_winners(db, job, media_dir, {"a": a, "b": b})
    assert sorted(lost.discarded) == sorted(o.key for o in lost.stored)


def test_the_same_task_finalized_twice_keeps_one_object_under_one_key(db, sandbox, media_dir):
    a, ra = _task(sandbox)
    job = _job(db, a)
    plain = LocalMediaStore(base_dir=media_dir)

    def winner_runs() -> None:
        assert _finalize(db, plain, job, ra, "worker").ok

    lost = _finalize(db, _Hooked(plain, winner_runs, None), job, ra, "reconcile")

    assert lost.ok is False and lost.discarded == []  # the same task's key: the winner's own
    _assert_store_is_the_winners(db, job, media_dir, {"a": a})
    assert len(_files(media_dir)) == 1


@pytest.mark.parametrize("round_", range(3))
def test_two_tasks_finalized_at_once_leave_only_the_winners_bytes(db, sandbox, media_dir, round_):
    a, ra = _task(sandbox)
    b, rb = _task(sandbox)
    job = _job(db, None)
    store = LocalMediaStore(base_dir=media_dir)
    start = threading.Barrier(4)
    oks: list[bool] = []

    def run(result: ProviderResult, source: str) -> None:
        start.wait(timeout=10)
        oks.append(_finalize(db, store, job, result, source).ok)

    threads = [
        threading.Thread(target=run, args=args)
        for args in ((ra, "worker"), (rb, "webhook"), (ra, "reconcile"), (rb, "webhook"))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert sorted(oks) == [False, False, False, True]
    _assert_store_is_the_winners(db, job, media_dir, {"a": a, "b": b})
