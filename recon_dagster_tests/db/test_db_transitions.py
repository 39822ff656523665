"""Guarded transitions and the worker-side writes (``db/transitions.py``) against a real PostgreSQL:
each wins once, never over a terminal row, and never relabels a persisted task."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.jobs import Claim
from recon_dagster_tests.support.factories import job_row, make_job

TTL = timedelta(minutes=10)


def claim(bind: sa.Engine, claims: list[Claim], owner: str, ttl: timedelta = TTL) -> list[Claim]:
    with bind.begin() as conn:
        return jobs_db.claim_jobs(conn, claims, owner, ttl)


# ---------------------------------------------------------------------------------------------
# Guarded transitions
# ---------------------------------------------------------------------------------------------


def complete(bind: sa.Engine, job_id: uuid.UUID) -> bool:
    with bind.begin() as conn:
        return jobs_db.complete_job(
            conn, job_id, output_data={"url": "s3://x"}, provider="kie", provider_cost=0.1, display_cost=3
        )


def fail(bind: sa.Engine, job_id: uuid.UUID) -> bool:
    with bind.begin() as conn:
        return jobs_db.fail_job(conn, job_id, "upstream failed")


def cancel(bind: sa.Engine, job_id: uuid.UUID) -> bool:
    with bind.begin() as conn:
        return jobs_db.cancel_job(conn, job_id)


@pytest.mark.parametrize("status", ["pending", "processing"])
def test_complete_wins_once_and_writes_the_result(db: sa.Engine, user: uuid.UUID, status: str) -> None:
    job = make_job(db, user, status=status, provider_kind="kie-standard", provider_task_id="t")
    claim(db, [Claim(job, 0)], "run-a")

    assert complete(db, job)
    assert not complete(db, job)

    r = job_row(db, job)
    assert r["status"] == "completed"
    assert r["output_data"] == {"url": "s3://x"}
    assert (r["progress"], r["provider"]) == (100, "kie")
    assert r["completed_at"] is not None
    assert (r["reconcile_lease_owner"], r["reconcile_lease_expires_at"]) == (None, None)


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_complete_never_over_a_terminal_row(db: sa.Engine, user: uuid.UUID, status: str) -> None:
    job = make_job(db, user, status=status, provider_kind="kie-standard", provider_task_id="t")

    assert not complete(db, job)

    r = job_row(db, job)
    assert r["status"] == status
    assert r["output_data"] is None


def test_fail_wins_once(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t")

    assert fail(db, job)
    assert not fail(db, job)

    r = job_row(db, job)
    assert (r["status"], r["error_message"]) == ("failed", "upstream failed")
    assert not complete(db, job)
    assert not cancel(db, job)
    assert job_row(db, job)["status"] == "failed"


@pytest.mark.parametrize("status", ["completed", "cancelled"])
def test_fail_never_over_completed_or_cancelled(db: sa.Engine, user: uuid.UUID, status: str) -> None:
    job = make_job(db, user, status=status, provider_kind="kie-standard", provider_task_id="t")

    assert not fail(db, job)

    r = job_row(db, job)
    assert (r["status"], r["error_message"]) == (status, None)


@pytest.mark.parametrize("status", ["pending", "processing"])
def test_cancel_only_in_flight_and_only_once(db: sa.Engine, user: uuid.UUID, status: str) -> None:
    job = make_job(db, user, status=status)

    assert cancel(db, job)
    assert not cancel(db, job)
    assert not complete(db, job)
    assert not fail(db, job)

    assert job_row(db, job)["status"] == "cancelled"


@pytest.mark.parametrize("status", ["completed", "failed"])
def test_cancel_never_over_a_finished_row(db: sa.Engine, user: uuid.UUID, status: str) -> None:
    job = make_job(db, user, status=status)

    assert not cancel(db, job)
    assert job_row(db, job)["status"] == status


def test_transitions_of_a_missing_row_are_false(db: sa.Engine) -> None:
    ghost = uuid.uuid4()
    assert not complete(db, ghost)
    assert not fail(db, ghost)
    assert not cancel(db, ghost)


def test_set_progress_only_moves_forward_and_is_clamped(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user)
    with db.begin() as conn:
        assert jobs_db.set_progress(conn, job, 40)
        assert jobs_db.set_progress(conn, job, 10)
    assert job_row(db, job)["progress"] == 40
    with db.begin() as conn:
        jobs_db.set_progress(conn, job, 250)
    assert job_row(db, job)["progress"] == 100


# ---------------------------------------------------------------------------------------------
# Worker-side instrumentation
# ---------------------------------------------------------------------------------------------


def record(bind: sa.Engine, job_id: uuid.UUID, kind: str, task_id: str) -> str | None:
    with bind.begin() as conn:
        return jobs_db.record_task_created(conn, job_id, kind, task_id)


def test_record_task_created_sets_kind_task_and_call_time(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, status="pending")

    assert record(db, job, "kie-veo", "veo-123") == "veo-123"

    r = job_row(db, job)
    assert (r["provider_kind"], r["provider_task_id"]) == ("kie-veo", "veo-123")
    assert r["provider_call_started_at"] is not None
    assert r["status"] == "pending"


def test_record_task_created_keeps_the_first_task_id_and_call_time(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="first", started_minutes_ago=3)
    before = job_row(db, job)["provider_call_started_at"]

    assert record(db, job, "kie-standard", "second") == "first"

    r = job_row(db, job)
    assert r["provider_task_id"] == "first"
    assert r["provider_call_started_at"] == before  # D8: never moves on a stall-retry


def test_record_task_created_is_idempotent_for_the_same_task(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user)
    assert record(db, job, "replicate-prediction", "p1") == "p1"
    first = job_row(db, job)["provider_call_started_at"]

    assert record(db, job, "replicate-prediction", "p1") == "p1"

    assert job_row(db, job)["provider_call_started_at"] == first


def test_record_task_created_keeps_a_sync_start_time(db: sa.Engine, user: uuid.UUID) -> None:
    # mark_provider_call_start ran first (3 minutes ago); the task id arriving later must not
    # restart the threshold clock.
    job = make_job(db, user, provider_kind="kie-standard", started_minutes_ago=3)
    before = job_row(db, job)["provider_call_started_at"]

    assert record(db, job, "kie-standard", "t1") == "t1"

    assert job_row(db, job)["provider_call_started_at"] == before


def test_record_task_created_for_a_missing_row_is_none(db: sa.Engine) -> None:
    assert record(db, uuid.uuid4(), "kie-standard", "t") is None


def test_a_losing_racer_does_not_relabel_the_persisted_task(db: sa.Engine, user: uuid.UUID) -> None:
    # The persisted task id belongs to the persisted kind; a second recorder must not change the
    # kind under it, or a resume would poll the first task at the second kind's endpoint.
    job = make_job(db, user, provider_kind="kie-veo", provider_task_id="veo-1", started_minutes_ago=3)

    assert record(db, job, "kie-standard", "std-2") == "veo-1"

    r = job_row(db, job)
    assert (r["provider_kind"], r["provider_task_id"]) == ("kie-veo", "veo-1")


@pytest.mark.parametrize("status", ["pending", "processing"])
def test_mark_provider_call_start_never_changes_status(db: sa.Engine, user: uuid.UUID, status: str) -> None:
    job = make_job(db, user, status=status)

    with db.begin() as conn:
        assert jobs_db.mark_provider_call_start(conn, job, "anthropic-sync")

    r = job_row(db, job)
    assert r["status"] == status
    assert r["provider_kind"] == "anthropic-sync"
    assert r["provider_call_started_at"] is not None
    assert r["provider_task_id"] is None


def test_mark_provider_call_start_on_a_missing_row_is_false(db: sa.Engine) -> None:
    with db.begin() as conn:
        assert not jobs_db.mark_provider_call_start(conn, uuid.uuid4(), "anthropic-sync")
