"""Every reservation of a job is settled or flagged: a job reserved twice is charged once at most,
its extra reservation refunded and logged as an anomaly, whether it ends failed or completed. Real
PostgreSQL."""

from __future__ import annotations

import uuid
from decimal import Decimal

import sqlalchemy as sa

from recon_dagster.db import credits
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import (
    balances,
    job_row,
    make_job,
    make_user,
    reserve,
)
from recon_dagster_tests.support.ledger import anomaly_reasons
from recon_dagster_tests.support.reconcile import make_defs, one, tick

D = Decimal


def _twice_reserved(db: sa.Engine, **job_kw: object) -> tuple[uuid.UUID, uuid.UUID, list[uuid.UUID]]:
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user, **job_kw)  # type: ignore[arg-type]
    logs = [
        reserve(db, job, user, 30, from_sub=20, from_topup=10),
        reserve(db, job, user, 12, from_sub=12, from_topup=0),
    ]
    return user, job, logs


def _statuses(db: sa.Engine, logs: list[uuid.UUID]) -> list[str]:
    return [one(db, "SELECT status FROM usage_logs WHERE id = :i", i=i) for i in logs]


def test_every_reservation_of_a_failed_job_is_refunded_and_flagged(db, instance, media_dir, sandbox):
    user, job, logs = _twice_reserved(db, provider_kind="anthropic-sync", started_minutes_ago=6)

    tick(make_defs(media_dir), instance, sweep=True)

    assert job_row(db, job)["status"] == "failed"
    assert _statuses(db, logs) == ["refunded", "refunded"]
    assert balances(db, user) == (D(100), D(50))
    assert anomaly_reasons(db, job) == ["extra_reservation"]


def test_a_completed_job_is_charged_once_and_its_extra_reservation_refunded_and_flagged(
    db, instance, media_dir, sandbox
):
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    user, job, logs = _twice_reserved(
        db, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=11
    )

    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "completed"
    assert _statuses(db, logs) == ["committed", "refunded"]
    assert balances(db, user) == (D(80), D(40))  # the first reservation spent, the extra back
    assert anomaly_reasons(db, job) == ["extra_reservation"]
    with db.begin() as conn:  # settling again finds nothing: no second commit or refund
        assert credits.commit_job_credits(conn, job, 1) is None
        assert credits.refund_reserved_credits_for_job(conn, job) is None
    assert balances(db, user) == (D(80), D(40))
