"""What a provider can tell us about the tasks an account has at the provider, and how to stop one.

The orphan sweep and the spend reconciliation read a provider's own record of its tasks through
these two capabilities. A provider that has a list endpoint (Replicate's predictions and
trainings, ElevenLabs' dubbings) offers ``TaskListing``; one that can stop a task offers
``TaskCancelling``. A provider without a list endpoint (KIE) offers neither listing: there the
create ledger is the only record of what we started.

Listing and cancelling go through the provider resource's own HTTP client, so they share its
limits, deadlines and redaction with polls.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol, runtime_checkable


class TaskPhase(StrEnum):
    """Where a listed task stands, in the provider's own words mapped to three buckets."""

    RUNNING = "running"  # queued, starting or processing: it may still bill
    SUCCEEDED = "succeeded"
    ENDED = "ended"  # failed, canceled or expired: nothing more will bill


@dataclass(frozen=True)
class UpstreamTask:
    """One task as the provider lists it."""

    provider: str
    task_id: str
    # The provider's own collection or kind of task (e.g. "predictions", "trainings", "dubbing").
    collection: str
    phase: TaskPhase
    # The provider's raw status word, for reports.
    status: str
    created_at: datetime | None
    completed_at: datetime | None = None
    # The job marker the provider echoed back (see the create ledger), when it echoes one.
    marker: str | None = None
    # The model, version or voice the task ran, when listed.
    model: str | None = None
    # The provider kind a job of this collection has (the lister knows; the sweep sorts by it).
    kind: str | None = None
    # What the provider reports of its cost: e.g. Replicate's metrics.predict_time / total_time.
    metrics: dict[str, float] = field(default_factory=dict)
    # The create ledger's fingerprint of what the task was asked (``db.ledger.fingerprint`` of its
    # listed input), when the provider lists it: how an unanswered create finds its task.
    fingerprint: str | None = None


class CancelResult(StrEnum):
    CANCELLED = "cancelled"  # the provider accepted the cancel (it may take a moment to stop)
    ALREADY_ENDED = "already_ended"  # it had already finished, failed or been cancelled
    NOT_FOUND = "not_found"
    REFUSED = "cancel_refused"  # the provider cannot cancel it (no cancel at all: KIE)


@runtime_checkable
class TaskListing(Protocol):
    """A provider that lists the account's recent tasks, newest first, page by page, one
    collection (Replicate's predictions, its trainings) at a time: the orphan sweep walks and
    judges each collection on its own, so one failed list never discards another's."""

    def task_collections(self) -> Mapping[str, frozenset[str]]:
        """Each collection this provider lists -> the provider kinds of the tasks it holds."""
        ...

    def list_collection(
        self, collection: str, *, created_after: datetime, created_before: datetime | None = None
    ) -> Iterator[UpstreamTask]:
        """Every task of ``collection`` created in ``[created_after, created_before)``."""
        ...

    def list_tasks(
        self, *, created_after: datetime, created_before: datetime | None = None
    ) -> Iterator[UpstreamTask]:
        """Every task created in ``[created_after, created_before)``; each page is one request
        through the provider's read limit."""
        ...


@runtime_checkable
class TaskCancelling(Protocol):
    """A provider that can stop a task it is running."""

    def cancel_task(self, collection: str, task_id: str) -> CancelResult: ...
