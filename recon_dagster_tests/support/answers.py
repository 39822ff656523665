"""Shared pieces of the answer tests: a stale job with its reservation, and leasing it to a run."""

from __future__ import annotations

import uuid
from datetime import timedelta

import sqlalchemy as sa

from recon_dagster.core.kinds import KINDS
from recon_dagster.db import jobs as jobs_db
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve


def stale_job(
    db: sa.Engine, kind: str, job_type: str, *, attempts: int = 0, task_id: str | None = None
) -> tuple[uuid.UUID, uuid.UUID]:
    """(user, job): a job of ``kind`` past its stale threshold, 30 credits reserved (20 sub + 10
    top-up) from a user holding 100 + 50; a task id the sandbox never issued unless given."""
    user = make_user(db, sub=100, topup=50)
    job = make_job(
        db,
        user,
        job_type=job_type,
        provider_kind=kind,
        provider_task_id=task_id or f"never-issued-{uuid.uuid4().hex[:10]}",
        started_minutes_ago=KINDS[kind].stale_threshold.total_seconds() / 60 + 1,
        reconcile_attempts=attempts,
    )
    reserve(db, job, user, 30, from_sub=20, from_topup=10)
    return user, job


def lease(db: sa.Engine, jobs: list[uuid.UUID], owner: str) -> None:
    """Lease ``jobs`` to ``owner`` as the sensor would before a run works them."""
    with db.begin() as conn:
        claims = [jobs_db.Claim(j, int(job_row(conn, j)["reconcile_attempts"])) for j in jobs]
        assert len(jobs_db.claim_jobs(conn, claims, owner, timedelta(minutes=10))) == len(jobs)
