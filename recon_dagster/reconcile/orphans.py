"""The orphan sweep's rule: what to do with one task a provider has for our account.

A task is *ours* only on proof: the create ledger holds its task id, or it carries the job marker
of one of our creates (the ledger then names the job), or a job row names it
(``jobs.provider_task_id``: an app that writes the task id on the row, as the spec's contract
asks, but not the ledger). A task that only *resembles* an unanswered create of ours (the same
fingerprint of what it asked, in that create's time window) is ``probably_ours``: another system
sharing the key and the prompt looks exactly alike, so it is reported with the create it
resembles and never cancelled nor adopted; the operator decides (``recon-dagster orphans
--adopt`` / ``--cancel``). Anything else is *unknown* and only reported. For ours, the job's row
decides:

- the row names the task and the job is in flight or completed: it is the reconciler's
  (``owned``); a job that failed or was cancelled collects nothing: its task is an orphan;
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

from recon_dagster.core.kinds import provider_names
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
    PROBABLY_OURS = "probably_ours"
    WAIT = "wait"


# What changes something (a job row, a task upstream, an anomaly) when acted on.
ACTING = frozenset({OrphanAction.ADOPT, OrphanAction.CANCEL, OrphanAction.ORPHAN_BILLED})


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
    return task.kind


def reconcile(
    task: UpstreamTask,
    create: Create | None,
    job: JobRow | None,
    *,
    now: datetime,
    grace: timedelta,
) -> OrphanVerdict:
    """The action for ``task``, given the ledger's create that made it (None: not in the ledger
    nor marked) and that create's job row, or without a create the job row naming the task (None:
    no such row)."""
    kind = task_kind(task, create)
    named = job is not None and job.provider_task_id == task.task_id
    if create is None and not named:
        return OrphanVerdict(task, OrphanAction.UNKNOWN, "not in the create ledger, no job marker and no "
                             "job names it: another system's, never cancelled", kind=kind)  # fmt: skip
    job_id = create.job_id if create is not None else job.id if job is not None else None
    if kind is None and job is not None:
        kind = job.provider_kind

    def verdict(action: OrphanAction, reason: str) -> OrphanVerdict:
        return OrphanVerdict(task, action, reason, job_id, create, kind)

    if named and job is not None and (job.inflight or job.status == "completed"):
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
        else f"job {job_id} names it but is {job.status}" if named
        else f"job {job_id} is {job.status}"
    )  # fmt: skip
    if task.phase is TaskPhase.RUNNING:
        return verdict(OrphanAction.CANCEL, f"{owner}: nobody will collect it ({task.status})")
    if task.phase is TaskPhase.SUCCEEDED:
        return verdict(OrphanAction.ORPHAN_BILLED, f"{owner}: it succeeded and billed for nothing")
    return verdict(OrphanAction.ENDED, f"{owner}; ended upstream ({task.status}): nothing bills")


def resembles(task: UpstreamTask, create: Create, job: JobRow | None) -> OrphanVerdict:
    """A task matched to an unanswered create by fingerprint only: a guess, never proof. Reported
    with the create it resembles; the operator adopts or cancels it explicitly."""
    state = "gone" if job is None else job.status
    return OrphanVerdict(
        task, OrphanAction.PROBABLY_OURS,
        f"asked what unanswered create {create.seq} of job {create.job_id} ({state}) asked, "
        f"{create.intent_at:%H:%M:%S} UTC, but carries no proof (no ledger task id, marker or job row): "
        f"never cancelled nor adopted; `recon-dagster orphans --adopt {task.task_id} --job {create.job_id}` "
        f"or `--cancel {task.task_id}`",
        create.job_id, create, task_kind(task, create),
    )  # fmt: skip


def match_unanswered(
    tasks: list[UpstreamTask], unanswered: list[Create], window: timedelta
) -> dict[str, Create]:
    """Task id -> the unanswered create (sending or ambiguous) it most resembles: the same
    fingerprint, created within ``window`` after the create's intent (nearest first), each task
    and each create used once. Tasks without a listed fingerprint or time never match. A
    resemblance only (``resembles``): never grounds to cancel or adopt."""
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
    return {p: r for p in provider_names() if (r := getattr(providers, p, None)) is not None}


def listable_providers(providers: Any) -> frozenset[str]:
    """The providers whose tasks the orphan sweep can list."""
    return frozenset(name for name, r in resources(providers).items() if isinstance(r, TaskListing))
