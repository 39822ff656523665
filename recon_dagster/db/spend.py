"""What our side says we spent at a provider over a period: the ``usage_logs`` rows of its jobs,
with the task each job's row names and every task id the create ledger holds for it. Reads only.

``Charge`` is one such row; the spend rules (``reconcile.spend``) compare them with the
provider's own record.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from recon_dagster.core.kinds import KINDS
from recon_dagster.db.ledger import TABLE as LEDGER
from recon_dagster.db.ledger import by_task_ids
from recon_dagster.db.sqltext import sql


@dataclass(frozen=True)
class Charge:
    """One ``usage_logs`` row of a job of the provider, with what the job's row and the ledger say
    of its upstream task."""

    job_id: uuid.UUID
    provider_kind: str
    status: str  # reserved | committed | refunded
    amount: Decimal
    cost_usd: Decimal | None
    created_at: datetime
    # The task the job's row names (jobs.provider_task_id), and every task id the ledger holds.
    row_task_id: str | None = None
    ledger_task_ids: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def charged(self) -> bool:
        return self.status == "committed"

    @property
    def task_ids(self) -> frozenset[str]:
        return frozenset(t for t in (self.row_task_id, *self.ledger_task_ids) if t)

    def number(self, key: str) -> float | None:
        """A figure the app recorded in ``usage_logs.metadata`` (characters, tokens, credits)."""
        value = self.metadata.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            return None
        try:
            number = float(value)
        except ValueError:
            return None
        return number if number == number and abs(number) != float("inf") else None


def kinds_of(provider: str) -> list[str]:
    return sorted(k for k, spec in KINDS.items() if str(spec.provider) == provider)


_CHARGES = sql(
    f"""
    SELECT u.job_id, j.provider_kind, u.status, u.amount, u.provider_cost_usd, u.created_at,
           u.metadata, j.provider_task_id,
           ARRAY(SELECT c.task_id FROM {LEDGER} c
                 WHERE c.job_id = u.job_id AND c.task_id IS NOT NULL ORDER BY c.seq) AS ledger_task_ids
    FROM usage_logs u JOIN jobs j ON j.id = u.job_id
    WHERE j.provider_kind = ANY(:kinds) AND u.created_at >= :start AND u.created_at < :end
    ORDER BY u.created_at, u.job_id
    """
).bindparams(sa.bindparam("kinds", type_=pg.ARRAY(sa.Text)))


def charges(conn: sa.Connection, provider: str, start: datetime, end: datetime) -> list[Charge]:
    """Every ``usage_logs`` row of ``provider``'s jobs created in ``[start, end)``."""
    rows = conn.execute(_CHARGES, {"kinds": kinds_of(provider), "start": start, "end": end}).mappings()
    out = []
    for r in rows:
        meta = r["metadata"]
        out.append(
            Charge(
                job_id=uuid.UUID(str(r["job_id"])),
                provider_kind=str(r["provider_kind"]),
                status=str(r["status"]),
                amount=Decimal(r["amount"]),
                cost_usd=None if r["provider_cost_usd"] is None else Decimal(r["provider_cost_usd"]),
                created_at=r["created_at"],
                row_task_id=r["provider_task_id"],
                ledger_task_ids=tuple(r["ledger_task_ids"] or ()),
                metadata=json.loads(meta) if isinstance(meta, str) else dict(meta or {}),
            )
        )
    return out


_CREATES_WITHOUT_CHARGE = sql(
    f"""
    SELECT c.task_id, c.job_id FROM {LEDGER} c LEFT JOIN jobs j ON j.id = c.job_id
    WHERE c.provider = :p AND c.intent_at >= :start AND c.intent_at < :end AND c.task_id IS NOT NULL
      AND COALESCE(c.fate, '') NOT IN ('ended', 'cancelled', 'not_found')
      AND (NOT EXISTS (SELECT 1 FROM usage_logs u WHERE u.job_id = c.job_id AND u.status <> 'refunded')
           OR (j.provider_task_id IS NOT NULL AND j.provider_task_id <> c.task_id))
    ORDER BY c.intent_at, c.task_id
    """
)


def creates_without_charge(
    conn: sa.Connection, provider: str, start: datetime, end: datetime
) -> list[tuple[str, uuid.UUID]]:
    """The ledger's tasks at ``provider`` created in ``[start, end)`` that no live charge pays
    for: their job has no charge that was not refunded, or its row names another task (an orphan).
    A task the ledger knows ended without billing (failed upstream, cancelled, never found) is
    left out."""
    rows = conn.execute(_CREATES_WITHOUT_CHARGE, {"p": provider, "start": start, "end": end})
    return [(str(r.task_id), uuid.UUID(str(r.job_id))) for r in rows]


_NAMED_BY_ROWS = sql(
    "SELECT provider_task_id, id FROM jobs WHERE provider_task_id = ANY(:t) AND provider_kind = ANY(:kinds)"
).bindparams(sa.bindparam("t", type_=pg.ARRAY(sa.Text)), sa.bindparam("kinds", type_=pg.ARRAY(sa.Text)))


def owners(conn: sa.Connection, provider: str, task_ids: Collection[str]) -> dict[str, uuid.UUID]:
    """The job of each of ``task_ids``: the ledger's (``ledger.by_task_ids``), else the job whose
    row names it (an app that writes the task id on its row but not the ledger owns it too)."""
    found = {task_id: create.job_id for task_id, create in by_task_ids(conn, provider, task_ids).items()}
    rest = [t for t in task_ids if t not in found]
    if rest:
        rows = conn.execute(_NAMED_BY_ROWS, {"t": rest, "kinds": kinds_of(provider)})
        found.update({str(r.provider_task_id): uuid.UUID(str(r.id)) for r in rows})
    return found


__all__ = ["Charge", "charges", "creates_without_charge", "kinds_of", "owners"]
