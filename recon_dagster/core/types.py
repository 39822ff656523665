"""The types every layer shares: a ``jobs`` row as reconciliation reads it, and its statuses.

Kept apart from ``recon_dagster.db`` so the pure domain (``reconcile.decide``) names a row without
depending on the adapter that loads it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

INFLIGHT_STATUSES = ("pending", "processing")
TERMINAL_STATUSES = ("completed", "failed", "cancelled")


@dataclass(frozen=True)
class JobRow:
    """The columns reconciliation reads. ``usage_log_id`` is deliberately absent (spec D7).

    A timestamp PostgreSQL holds and Python's datetime cannot (``infinity`` / ``-infinity``, a BC
    date, a year past 9999) is read as None and its column named in ``nonfinite``, so one such row
    never breaks a read of many.
    """

    id: uuid.UUID
    status: str
    user_id: uuid.UUID
    job_type: str
    provider_kind: str | None
    provider_task_id: str | None
    provider_call_started_at: datetime | None
    reconcile_attempts: int
    reconcile_last_error: str | None
    reconcile_lease_owner: str | None
    reconcile_lease_expires_at: datetime | None
    should_watermark: bool | None
    is_public: bool | None
    workflow_execution_id: uuid.UUID | None
    node_id: str | None
    progress: int
    created_at: datetime | None
    started_at: datetime | None
    nonfinite: tuple[str, ...] = ()

    @property
    def inflight(self) -> bool:
        return self.status in INFLIGHT_STATUSES
