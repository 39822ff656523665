"""Shared pieces of the orphan-sweep tests: one sweep pass with test-sized settings, ledger rows
as a worker would have left them, and a snapshot of every table."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from recon_dagster.core.kinds import get_kind
from recon_dagster.db import ledger
from recon_dagster.reconcile.orphan_sweep import OrphanReport, SweepPolicy, sweep_orphans


def sweep(
    engine: sa.Engine, providers: Any, *, act: bool = True, grace_s: float = 0.0, shadow: bool = False
) -> OrphanReport:
    policy = SweepPolicy(
        window=timedelta(hours=6), grace=timedelta(seconds=grace_s), act=act, shadowed=lambda kind: shadow
    )
    return sweep_orphans(engine, providers, policy)


def recorded(engine: sa.Engine, job: uuid.UUID, kind: str, task_id: str) -> ledger.Create:
    """The ledger row a worker's create of ``task_id`` for ``job`` left (intent, then task id)."""
    provider = str(get_kind(kind).provider)
    with engine.begin() as conn:
        intent = ledger.record_intent(
            conn, job, provider=provider, kind=kind, fingerprint="f", marker_sent=False
        )
        return ledger.record_task(conn, job, provider=provider, kind=kind, task_id=task_id, create=intent.id)


def actions(report: OrphanReport) -> dict[str, str]:
    """task id -> the sweep's action for it."""
    return {s.verdict.task.task_id: s.verdict.action.value for s in report.tasks}


def snapshot(engine: sa.Engine) -> dict[str, str]:
    """Every table of the database as one digest each (rows in a stable order)."""
    with engine.connect() as conn:
        tables = (
            conn.execute(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"))
            .scalars()
            .all()
        )
        return {
            t: str(
                conn.execute(
                    sa.text(
                        f"SELECT md5(COALESCE(string_agg(x::text, '|' ORDER BY x::text), '')) FROM \"{t}\" x"
                    )
                ).scalar()
            )
            for t in tables
        }


def anomaly_details(engine: sa.Engine, job: uuid.UUID, reason: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [
            dict(r)
            for r in conn.execute(
                sa.text("SELECT details FROM credit_anomalies WHERE job_id = :j AND reason = :r"),
                {"j": str(job), "r": reason},
            ).scalars()
        ]
