"""What ``finalize_job_with_media`` returns and records beyond the money: the answer for a missing
row, the output_data shape, the task id carried from the poll, the process's media client."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.media.store import LocalMediaStore, StoredObject
from recon_dagster.providers.status import MediaRef, UpstreamState, UpstreamStatus
from recon_dagster.reconcile.finalize import (
    ProviderResult,
    finalize_job_with_media,
    shared_media_client,
)
from recon_dagster.sandbox import SandboxServer
from recon_dagster_tests.support.factories import job_row, make_job, make_user
from recon_dagster_tests.support.reconcile import finished_training


def test_finalize_of_a_missing_job_is_not_ok_and_says_why(db: sa.Engine, media_dir: str) -> None:
    out = finalize_job_with_media(
        db,
        LocalMediaStore(base_dir=media_dir),
        uuid.uuid4(),
        ProviderResult("kie-standard", result={"text": "x"}),
        source="test",
    )
    assert out.ok is False
    assert out.reason == "job not found"


@pytest.fixture
def training(db: sa.Engine, sandbox: SandboxServer) -> tuple[uuid.UUID, Any, Any]:
    """An in-flight LoRA training job whose upstream training the sandbox finished: (job, result, policy)."""
    task, result, policy = finished_training(sandbox)
    job = make_job(
        db, make_user(db), job_type="lora-training", provider_kind="replicate-training", provider_task_id=task
    )
    return job, result, policy


def test_output_data_records_each_stored_object(
    db: sa.Engine, media_dir: str, training: tuple[uuid.UUID, Any, Any]
) -> None:
    job, result, policy = training

    out = finalize_job_with_media(
        db, LocalMediaStore(base_dir=media_dir), job, result, source="test", policy=policy
    )

    assert out.ok and out.stored
    media = job_row(db, job)["output_data"]["media"]
    assert media == [{"key": o.key, "url": o.url, "size": o.size, "sha256": o.sha256} for o in out.stored]


def test_a_provider_result_keeps_everything_the_poll_said() -> None:
    status = UpstreamStatus(
        provider_kind="replicate-prediction",
        task_id="p-42",
        state=UpstreamState.SUCCEEDED,
        media=(MediaRef(url="https://example.com/a.png", kind="image"),),
        cost_usd=0.031,
        result={"text": "hi"},
    )
    r = ProviderResult.from_status(status)
    assert (r.provider_kind, r.task_id, r.cost_usd, r.result, r.media) == (
        "replicate-prediction",
        "p-42",
        0.031,
        {"text": "hi"},
        status.media,
    )
    assert r.provider == "replicate"


def test_the_media_client_is_made_once_per_process_and_follows_no_redirect_itself() -> None:
    # One client per process (its TLS context is expensive); redirects are followed by the fetch
    # policy, hop by hop, never by httpx. (Its proxy routes: recon_dagster_tests/media/test_proxy.py.)
    client = shared_media_client()
    assert shared_media_client() is client
    assert client.follow_redirects is False


class _CancelWhileStoring:
    """A store during whose upload the user cancels: the finalize loses its guarded completion."""

    def __init__(self, inner: LocalMediaStore, engine: sa.Engine, job_id: uuid.UUID) -> None:
        self.inner, self.engine, self.job_id = inner, engine, job_id

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> StoredObject:
        obj = self.inner.put_stream(key, chunks, content_type)
        with self.engine.begin() as conn:
            jobs_db.cancel_job(conn, self.job_id)
        return obj

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_finalize_that_loses_says_another_writer_won(
    db: sa.Engine, media_dir: str, training: tuple[uuid.UUID, Any, Any]
) -> None:
    job, result, policy = training
    store = _CancelWhileStoring(LocalMediaStore(base_dir=media_dir), db, job)

    out = finalize_job_with_media(db, store, job, result, source="test", policy=policy)

    assert (out.ok, out.reason) == (False, "another writer finished the job first")
    assert job_row(db, job)["status"] == "cancelled"
    assert out.discarded == [o.key for o in out.stored]


class _CancelWhileStoringDeleteFails(_CancelWhileStoring):
    def delete(self, key: str) -> None:
        raise OSError(f"store refused to delete {key}")


def test_a_losing_finalize_whose_cleanup_fails_logs_the_job_and_key(
    db: sa.Engine, media_dir: str, training: tuple[uuid.UUID, Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    job, result, policy = training
    store = _CancelWhileStoringDeleteFails(LocalMediaStore(base_dir=media_dir), db, job)

    with caplog.at_level(logging.ERROR, logger="recon_dagster.finalize"):
        out = finalize_job_with_media(db, store, job, result, source="test", policy=policy)

    assert out.ok is False and out.discarded == []
    messages = [r.getMessage() for r in caplog.records]
    assert messages and all(str(job) in m for m in messages)
    assert out.stored and all(any(o.key in m for m in messages) for o in out.stored)
