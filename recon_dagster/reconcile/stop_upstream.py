"""A job failed and refunded while its task may still run upstream: stop the task, or hand it on.

Whoever force-fails a job (the operator's ``fail``, the attempt cap) refunds the user; a task
still queued or running at the provider would keep billing for a result nobody collects. Once the
guarded fail has won, ``stop_task``:

1. records the task in the create ledger as the job's (``ledger.record_task``, idempotent): the
   job row names it, so it is provably ours (``reconcile.orphans``), and the ledger is what the
   orphan sweep follows for a provider that cannot list its tasks (fal, KIE);
2. cancels it where the provider can (``TaskCancelling``: fal, Replicate, ElevenLabs) and the
   caller asks it to, recording what the cancel really did as the task's fate (``cancelled``,
   ``already_ended``, ``not_found``: the orphan sweep's own words);
3. otherwise hands it to the orphan sweep: fate ``handed_to_sweep`` (a followed fate: the sweep
   polls or lists it on every pass until it ends, cancels it while it runs, and reports an
   ``orphan_billed`` anomaly if it succeeded anyway). That is the path when the provider cannot
   cancel, is not configured here, did not answer the cancel, or (at the cap) did not answer the
   last poll: during an outage a cancel would only time out, the sweep cancels once it answers.

Never raises: the job is already failed and refunded, and a stop that could not even be
recorded is logged and said in the returned line (the sweep still finds a Replicate task by the
job row naming it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from recon_dagster.core.kinds import KINDS
from recon_dagster.core.redaction import redact_secrets
from recon_dagster.core.types import JobRow
from recon_dagster.db import ledger
from recon_dagster.providers.upstream_tasks import CancelResult, TaskCancelling, TaskListing
from recon_dagster.reconcile.orphan_sweep import CANCEL_FATES

log = logging.getLogger("recon_dagster.reconcile.stop_upstream")

# The fates a stop may overwrite: the job owned its task (attached, adopted) or the sweep was
# already following it. A fate that is an end (cancelled, ended, orphan_billed) stays.
_OVER = (ledger.Fate.ATTACHED, ledger.Fate.ADOPTED, *ledger.FOLLOWED)


@dataclass(frozen=True)
class Stopped:
    """What became of a force-failed job's upstream task."""

    task_id: str
    provider: str
    fate: ledger.Fate | None  # None: nothing could be recorded (logged)
    line: str  # for the job's story and the operator: "task X cancelled at fal", "... handed to ..."

    @property
    def handed(self) -> bool:
        return self.fate in ledger.FOLLOWED


def collection_of(resource: Any, kind: str) -> str:
    """The provider collection a task of ``kind`` lives in (Replicate's predictions or trainings);
    a provider with one queue per app (fal) takes the kind and ignores it."""
    if isinstance(resource, TaskListing):
        for collection, kinds in resource.task_collections().items():
            if kind in kinds:
                return collection
    return kind


def _lines(provider: str, task_id: str) -> Mapping[ledger.Fate, str]:
    at = f"task {task_id} at {provider}"
    return {
        ledger.Fate.CANCELLED: f"upstream {at} cancelled",
        ledger.Fate.NOT_FOUND: f"upstream {at} not found (nothing to stop)",
        ledger.Fate.ALREADY_ENDED: f"upstream {at} had already ended; the orphan sweep follows it "
        "(an orphan_billed anomaly if it succeeded)",
        ledger.Fate.CANCEL_REFUSED: f"upstream {at}: {provider} cannot cancel it; handed to the orphan "
        "sweep, which follows it until it ends",
    }


def stop_task(
    engine: sa.Engine, providers: Any | None, row: JobRow, *, cancel_now: bool, why_not: str = ""
) -> Stopped | None:
    """Stop the upstream task ``row`` (a job just force-failed) names: cancel it now when
    ``cancel_now`` and the provider can, else hand it to the orphan sweep (``why_not`` says why not
    now, for the story). None: the row names no task (a lost create is the sweep's already)."""
    task_id, kind = row.provider_task_id, row.provider_kind
    spec = KINDS.get(kind or "")
    if not task_id or spec is None or not spec.is_async or kind is None:
        return None
    provider = str(spec.provider)
    try:
        with engine.begin() as conn:
            create = ledger.record_task(conn, row.id, provider=provider, kind=kind, task_id=task_id)
    except Exception as exc:
        log.exception("job %s: its task %s could not be recorded for the orphan sweep", row.id, task_id)
        return Stopped(task_id, provider, None, f"upstream task {task_id} at {provider} not recorded "
                       f"({type(exc).__name__}); the orphan sweep finds it only by a list")  # fmt: skip
    fate, detail = _cancel(providers, kind, provider, task_id, cancel_now=cancel_now, why_not=why_not)
    try:
        with engine.begin() as conn:
            ledger.set_fate(conn, create.id, fate, {"done": detail, "by": "force-fail"}, replaces=_OVER)
    except Exception:
        log.exception("job %s: the fate of task %s could not be recorded", row.id, task_id)
    if fate is ledger.Fate.HANDED_TO_SWEEP:
        return Stopped(task_id, provider, fate, f"upstream task {task_id} at {provider} handed to the orphan "
                       f"sweep, which cancels it while it runs ({detail})")  # fmt: skip
    return Stopped(task_id, provider, fate, _lines(provider, task_id)[fate])


def _cancel(
    providers: Any | None, kind: str, provider: str, task_id: str, *, cancel_now: bool, why_not: str
) -> tuple[ledger.Fate, str]:
    if not cancel_now:
        return ledger.Fate.HANDED_TO_SWEEP, why_not or "not cancelled now"
    if providers is None:
        return ledger.Fate.HANDED_TO_SWEEP, "no provider client here"
    try:
        resource = providers.for_kind(kind)
    except Exception as exc:  # not configured in this process: the sweep's process may be
        return ledger.Fate.HANDED_TO_SWEEP, redact_secrets(f"{provider} not usable here: {exc}")[:300]
    if not isinstance(resource, TaskCancelling):
        return CANCEL_FATES[CancelResult.REFUSED], f"{provider} has no cancel"
    try:
        result = resource.cancel_task(collection_of(resource, kind), task_id)
    except Exception as exc:  # a 5xx, a timeout, a refused connection: the sweep tries again
        return ledger.Fate.HANDED_TO_SWEEP, redact_secrets(
            f"{provider} did not answer the cancel: {type(exc).__name__}: {exc}"
        )[:300]
    return CANCEL_FATES[result], result.value
