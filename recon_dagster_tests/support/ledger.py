"""Read the host app's ledger (``usage_logs``, ``credit_anomalies``), the reconciler's events and the
limiter's slots the way the tests check them."""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa


def usage_logs(bind: sa.Engine, job_id: uuid.UUID) -> list[dict[str, Any]]:
    """Every ``usage_logs`` row of a job, oldest first."""
    with bind.begin() as conn:
        return [
            dict(r)
            for r in conn.execute(
                sa.text("SELECT * FROM usage_logs WHERE job_id = :j ORDER BY created_at, id"),
                {"j": str(job_id)},
            ).mappings()
        ]


def anomalies(bind: sa.Engine, job_id: uuid.UUID | None = None) -> list[dict[str, Any]]:
    """Every ``credit_anomalies`` row (of one job with ``job_id``), in the order they were logged."""
    where, params = ("WHERE job_id = :j ", {"j": str(job_id)}) if job_id is not None else ("", {})
    with bind.begin() as conn:
        return [
            dict(r)
            for r in conn.execute(
                sa.text(f"SELECT * FROM credit_anomalies {where}ORDER BY id"), params
            ).mappings()
        ]


def anomaly_reasons(bind: sa.Engine, job_id: uuid.UUID) -> list[str]:
    """The ``reason`` of each anomaly logged for a job, in order."""
    return [a["reason"] for a in anomalies(bind, job_id)]


def reconcile_events(bind: sa.Engine, job_id: uuid.UUID) -> list[sa.Row[Any]]:
    """A job's ``reconcile_events`` as ``(outcome, detail, attempt)``, oldest first."""
    with bind.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT outcome, detail, attempt FROM reconcile_events WHERE job_id = :j ORDER BY id"
                ),
                {"j": str(job_id)},
            ).all()
        )


def held_slots(bind: sa.Engine, account: str) -> int:
    """How many of an account's concurrency slots are held and not expired."""
    with bind.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM provider_limit_slots WHERE account = :a AND holder IS NOT NULL "
                    "AND expires_at > clock_timestamp()"
                ),
                {"a": account},
            ).scalar_one()
        )
