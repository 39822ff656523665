"""A finalize that loses its guarded completion removes the media it wrote, unless the winner is a
completion that references the same (deterministic) keys. Real PostgreSQL, real
HTTP to the sandbox, a real media folder; the competing write lands between the media phase and
the settle transaction, where the race really happens."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

import pytest
import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.media.store import LocalMediaStore, StoredObject
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.finalize import (
    ProviderResult,
    finalize_job_with_media,
    media_to_discard,
)
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import media_policy, stored_files


def _finished_job(db, sandbox, *, watermark=False, media_count=1):
    user = make_user(db)
    kind = "kie-standard"
    task = sandbox.add_task(kind, Scenario(polls_before_done=0, media_count=media_count))
    job = make_job(
        db,
        user,
        provider_kind=kind,
        provider_task_id=task,
        started_minutes_ago=30,
        should_watermark=watermark,
    )
    reserve(db, job, user, 10)
    return job, ProviderResult.from_status(providers_from_env().poll(kind, task))


class _InterruptAfterUpload:
    """A store that runs ``interrupt`` once, after this finalize's last upload: a competing writer
    settles the row while this one is between its media phase and its settle transaction."""

    def __init__(self, inner: LocalMediaStore, uploads: int, interrupt: Callable[[], None]) -> None:
        self.inner, self.left, self.interrupt = inner, uploads, interrupt

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> StoredObject:
        obj = self.inner.put_stream(key, chunks, content_type)
        self.left -= 1
        if self.left == 0:
            self.interrupt()
        return obj

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


_files = stored_files


def _terminal(db: sa.Engine, job: uuid.UUID, how: str) -> Callable[[], None]:
    def settle() -> None:
        with db.begin() as conn:
            ok = jobs_db.cancel_job(conn, job) if how == "cancel" else jobs_db.fail_job(conn, job, "swept")
            assert ok

    return settle


@pytest.mark.parametrize("how", ["cancel", "fail"])
@pytest.mark.parametrize(("watermark", "media_count"), [(False, 1), (False, 2), (True, 1)])
def test_losing_to_a_cancel_or_a_failure_removes_every_object_written(
    db, sandbox, media_dir, how, watermark, media_count
):
    job, result = _finished_job(db, sandbox, watermark=watermark, media_count=media_count)
    uploads = media_count  # a watermarked image is stored only as its watermarked variant
    store = _InterruptAfterUpload(LocalMediaStore(base_dir=media_dir), uploads, _terminal(db, job, how))

    res = finalize_job_with_media(db, store, job, result, source="reconcile", policy=media_policy())

    assert res.ok is False and len(res.stored) == uploads
    assert sorted(res.discarded) == sorted(o.key for o in res.stored)
    assert _files(media_dir) == {}
    assert job_row(db, job)["status"] == ("cancelled" if how == "cancel" else "failed")


@pytest.mark.parametrize("watermark", [False, True])
def test_losing_to_a_completion_of_the_same_keys_keeps_the_winners_media(db, sandbox, media_dir, watermark):
    job, result = _finished_job(db, sandbox, watermark=watermark)
    plain = LocalMediaStore(base_dir=media_dir)

    def winner_completes() -> None:
        won = finalize_job_with_media(db, plain, job, result, source="worker", policy=media_policy())
        assert won.ok

    store = _InterruptAfterUpload(plain, 1, winner_completes)
    res = finalize_job_with_media(db, store, job, result, source="webhook", policy=media_policy())

    assert res.ok is False and res.discarded == []
    row = job_row(db, job)
    assert row["status"] == "completed" and row["output_data"]["finalized_by"] == "worker"
    recorded = {m["key"]: m["sha256"] for m in row["output_data"]["media"]}
    assert _files(media_dir) == recorded  # every object the winner references is there, intact


def test_the_discard_rule():
    keys = ["images/j/0.png", "images/j/0.watermarked.png"]
    winner_output = '{"media": [{"key": "images/j/0.png"}, {"key": "images/j/0.watermarked.png"}]}'
    assert media_to_discard(keys, "completed", winner_output) == []
    # A completion that names other keys (another extension): ours are orphans.
    assert media_to_discard(keys, "completed", '{"media": [{"key": "images/j/0.jpg"}]}') == keys
    assert media_to_discard(keys, "completed", "images/j/0.png s3://bucket/images/j/0.png") == keys[1:]
    for status in ("cancelled", "failed", None):
        assert media_to_discard(keys, status, winner_output) == keys
