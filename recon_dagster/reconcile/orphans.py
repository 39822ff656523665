"""The orphan sweep's rule: what to do with one task a provider has for our account.

A task is *ours* when the create ledger holds its task id, or it carries the job marker of one of
our creates (the ledger then names the job), or it matches an unanswered create of ours by
fingerprint in that create's time window; else it is *unknown* (another system may share the key)
and is only reported, never cancelled. For ours, the job's row decides:

- the row names the task: it is the reconciler's (``owned``);
- the row is in flight without a task id (its create was ambiguous, or its worker died between
  the provider's answer and the row's update) and the task runs or succeeded: ``adopt`` it, so
  the reconciler polls it and recovers the result instead of refunding;
- otherwise nobody will collect it: running, ``cancel`` it; succeeded, it billed for nothing
  (``orphan_billed``, with the provider's reported cost); ended on its own, nothing bills (``ended``).

A task younger than the grace period next to a job still in flight is left to its worker
(``wait``). Pure: no I/O, no settings; ``orphan_sweep`` reads and acts.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from recon_dagster.core.kinds import Provider
from recon_dagster.core.types import JobRow
from recon_dagster.db.ledger import Create
from recon_dagster.providers.upstream_tasks import TaskListing, TaskPhase, UpstreamTask


class OrphanAction(StrEnum):
    OWNED = "owned"
    ADOPT = "adopt"
    CANCEL = "cancel"
    ORPHAN_BILLED = "orphan_billed"
    ENDED = "ended"
    UNKNOWN = "unknown"
    WAIT = "wait"


# What changes something (a job row, a task upstream, an anomaly) when acted on.
ACTING = frozenset({OrphanAction.ADOPT, OrphanAction.CANCEL, OrphanAction.ORPHAN_BILLED})

# A listed task's collection, as the provider kind a job of it has.
COLLECTION_KINDS = {
    ("replicate", "predictions"): "replicate-prediction",
    ("replicate", "trainings"): "replicate-training",
    ("elevenlabs", "dubbing"): "elevenlabs-async",
}


@dataclass(frozen=True)
class OrphanVerdict:
    task: UpstreamTask
    action: OrphanAction
    reason: str
    job_id: uuid.UUID | None = None
    create: Create | None = None
    kind: str | None = None

    @property
    def cost(self) -> dict[str, float]:
        """What the provider reports of the task's cost (e.g. Replicate's ``predict_time``)."""
        return dict(self.task.metrics)


def task_kind(task: UpstreamTask, create: Create | None) -> str | None:
    if create is not None:
        return create.provider_kind
    return COLLECTION_KINDS.get((task.provider, task.collection))


def reconcile(
    task: UpstreamTask,
    create: Create | None,
    job: JobRow | None,
    *,
    now: datetime,
    grace: timedelta,
) -> OrphanVerdict:
    """The action for ``task``, given the ledger's create that made it (None: not ours, as far as
    the ledger knows) and that create's job row (None: no such row)."""
    kind = task_kind(task, create)
    if create is None:
        return OrphanVerdict(task, OrphanAction.UNKNOWN, "not in the create ledger and no job marker: "
                             "another system's, never cancelled", kind=kind)  # fmt: skip
    job_id = create.job_id

    def verdict(action: OrphanAction, reason: str) -> OrphanVerdict:
        return OrphanVerdict(task, action, reason, job_id, create, kind)

    if job is not None and job.provider_task_id == task.task_id:
        return verdict(OrphanAction.OWNED, f"job {job_id} names it: the reconciler's")
    young = task.created_at is not None and task.created_at > now - grace
    inflight = job is not None and job.inflight
    if inflight and young:
        return verdict(
            OrphanAction.WAIT,
            f"created under {grace.total_seconds():g} s ago: its worker may still record it",
        )
    if inflight and job is not None and not job.provider_task_id:
        if task.phase is TaskPhase.ENDED:
            return verdict(
                OrphanAction.ENDED, f"ended upstream ({task.status}); job {job_id} is swept as before"
            )
        return verdict(OrphanAction.ADOPT, f"job {job_id} is {job.status} without a task id: adopted, "
                       "so the reconciler recovers its result")  # fmt: skip
    owner = (
        f"job {job_id} is gone" if job is None
        else f"job {job_id} already has task {job.provider_task_id}" if inflight
        else f"job {job_id} is {job.status}"
    )  # fmt: skip
    if task.phase is TaskPhase.RUNNING:
        return verdict(OrphanAction.CANCEL, f"{owner}: nobody will collect it ({task.status})")
    if task.phase is TaskPhase.SUCCEEDED:
        return verdict(OrphanAction.ORPHAN_BILLED, f"{owner}: it succeeded and billed for nothing")
    return verdict(OrphanAction.ENDED, f"{owner}; ended upstream ({task.status}): nothing bills")


def match_unanswered(
    tasks: list[UpstreamTask], unanswered: list[Create], window: timedelta
) -> dict[str, Create]:
    """Task id -> the unanswered create (sending or ambiguous) it most likely is: the same
    fingerprint, created within ``window`` after the create's intent (nearest first), each task
    and each create used once. Tasks without a listed fingerprint or time never match."""
    matched: dict[str, Create] = {}
    for create in sorted(unanswered, key=lambda c: c.intent_at):
        if not create.fingerprint:
            continue
        candidates = [
            t for t in tasks
            if t.task_id not in matched and t.fingerprint == create.fingerprint and t.created_at is not None
            and create.intent_at - timedelta(seconds=5) <= t.created_at <= create.intent_at + window
        ]  # fmt: skip
        if candidates:
            best = min(candidates, key=lambda t: abs((t.created_at or create.intent_at) - create.intent_at))
            matched[best.task_id] = create
    return matched


def phase_of_poll(state: str) -> TaskPhase:
    """A poll's ``UpstreamState`` value as a listed phase (the ledger-only providers are polled)."""
    if state == "succeeded":
        return TaskPhase.SUCCEEDED
    if state in ("running",):
        return TaskPhase.RUNNING
    return TaskPhase.ENDED


def resources(providers: Any) -> dict[str, Any]:
    """The provider resources of ``providers`` (the ``ProvidersResource``), by provider name."""
    return {p.value: r for p in Provider if (r := getattr(providers, p.value, None)) is not None}


def listable_providers(providers: Any) -> frozenset[str]:
    """The providers whose tasks the orphan sweep can list."""
    return frozenset(name for name, r in resources(providers).items() if isinstance(r, TaskListing))
