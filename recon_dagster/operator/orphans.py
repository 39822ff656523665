"""The orphan sweep as the operator and Dagster run it: the settings read, the providers wired.

``orphan_policy`` reads ``RECON_ORPHAN_WINDOW_S`` / ``RECON_ORPHAN_GRACE_S`` and the modes (the
domain reads no settings); ``dry_run_providers`` are the providers with per-process limits only,
so a dry run writes nothing at all, not even the account limiter's shared rows.

``adopt_probable`` / ``cancel_probable`` are the operator's word on a task the sweep could only
call ``probably_ours`` (it resembles an unanswered create of ours, with no proof): the task is
found again in the provider's list, must still be ``probably_ours``, and the action is written
with the ledger (the task id becomes the create's, its fate says what was done) and recorded in
``reconcile_events`` with who and why (``operator_adopt`` / ``operator_cancel``), as retry and
fail are.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from recon_dagster.config import settings
from recon_dagster.core.kinds import get_kind, provider_names
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db import ledger
from recon_dagster.operator.actions import (
    ADOPT,
    CANCEL,
    MAX_REASON,
    OperatorError,
    _job_id,
    _refuse,
    _refuse_if_shadowed,
    record_action,
)
from recon_dagster.operator.modes import shadow_modes
from recon_dagster.reconcile.orphan_sweep import CANCEL_FATES, SweepPolicy, adopt, cancel, find_listed
from recon_dagster.reconcile.orphans import OrphanAction, OrphanVerdict

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.I)
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW = timedelta(days=30)


def parse_duration(text: str) -> timedelta:
    """``90``, ``90s``, ``30m``, ``6h``, ``2d``: a positive duration of at most 30 days."""
    match = _DURATION.match(text or "")
    if match is None:
        raise ValueError(f"--since must be a duration like 30m, 6h or 2d, got {text!r}")
    value = timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2).lower()])
    if not timedelta(0) < value <= MAX_WINDOW:
        raise ValueError(f"--since must be more than 0 and at most 30d, got {text!r}")
    return value


def orphan_policy(*, act: bool, since: timedelta | None = None, run_id: str | None = None) -> SweepPolicy:
    now = settings()
    return SweepPolicy(
        window=since or timedelta(seconds=now.orphan_window_s),
        grace=timedelta(seconds=now.orphan_grace_s),
        act=act,
        shadowed=shadow_modes().shadowed,
        run_id=run_id,
    )


def dry_run_providers(providers: Any) -> Any:
    """``providers`` with each resource's account budget kept in this process (a dry run must not
    write the shared limiter's rows)."""
    update = {
        name: resource.model_copy(update={"shared_limits": False})
        for name in provider_names()
        if (resource := getattr(providers, name, None)) is not None
    }
    return providers.model_copy(update=update)


@dataclass(frozen=True)
class HandDone:
    task_id: str
    job_id: uuid.UUID
    line: str


def _probable(engine: sa.Engine, providers: Any, task_id: str, policy: SweepPolicy,
              provider: str | None = None) -> tuple[Any, OrphanVerdict]:  # fmt: skip
    task_id = (task_id or "").strip()
    if not task_id:
        raise OperatorError("a task id is required")
    try:
        found = find_listed(engine, providers, task_id, policy, provider=provider)
    except ValueError as exc:
        raise OperatorError(f"the provider's list failed, nothing done: {exc}") from None
    if found is None:
        raise OperatorError(
            f"no listed task {task_id} in the last {policy.window} (--since to look further back)"
        )
    resource, v = found
    if v.action is not OrphanAction.PROBABLY_OURS:
        raise OperatorError(
            f"task {task_id} is {v.action.value}, not probably_ours ({v.reason}); the sweep handles "
            "what is provably ours and never touches another system's"
        )
    return resource, v


def adopt_probable(
    engine: sa.Engine, providers: Any, task_id: str, job_id: str | uuid.UUID, policy: SweepPolicy, *,
    who: str, why: str = "", run_id: str | None = None,
) -> HandDone:  # fmt: skip
    """Attach a ``probably_ours`` task to ``job_id`` (in flight, without a task id, of the task's
    provider): the ledger records the task as the job's, the job's row names it (a guarded
    compare-and-set), and the reconciler then polls and recovers it."""
    jid = _job_id(job_id)
    why = " ".join(why.split())[:MAX_REASON] or "adopted by hand: probably ours"
    with engine.connect() as conn:
        row = jobs_db.load_job(conn, jid)
        if row is None or not row.inflight:
            raise _refuse(conn, jid, "adopt")
    _refuse_if_shadowed(row, "adopt")
    if row.provider_task_id:
        raise OperatorError(f"job {jid} already names task {row.provider_task_id}; nothing to adopt")
    # The row's kind when it has one (a lost create's row may not): else the create it resembles.
    provider = str(get_kind(row.provider_kind).provider) if row.provider_kind else None
    _, v = _probable(engine, providers, task_id, policy, provider=provider)
    resembled = v.create
    kind = row.provider_kind or (resembled.provider_kind if resembled is not None else None) or v.kind
    if not kind:
        raise OperatorError(f"job {jid} has no provider kind and task {task_id} names none")
    provider = v.task.provider
    with engine.begin() as conn:
        create = ledger.record_task(
            conn, jid, provider=provider, kind=kind, task_id=v.task.task_id,
            create=resembled.id if resembled is not None and resembled.job_id == jid else None,
        )  # fmt: skip
        if not adopt(conn, jid, kind, v.task):  # raising rolls the ledger's write back too
            raise OperatorError(f"job {jid} changed meanwhile (ended, or got a task id): nothing adopted")
        ledger.set_fate(conn, create.id, ledger.Fate.ADOPTED, {"by": who, "why": why, "status": v.task.status},
                        replaces=[ledger.Fate.ATTACHED])  # fmt: skip
        record_action(conn, row, ADOPT, who, f"task {v.task.task_id}: {why}", run_id)
    return HandDone(
        v.task.task_id, jid, f"task {v.task.task_id} adopted onto job {jid}; the reconciler polls it next"
    )


def cancel_probable(
    engine: sa.Engine, providers: Any, task_id: str, policy: SweepPolicy, *,
    who: str, why: str = "", run_id: str | None = None,
) -> HandDone:  # fmt: skip
    """Cancel a ``probably_ours`` task upstream: the ledger records it as the task of the create it
    resembles, with what the cancel really did; the job's story records who and why."""
    why = " ".join(why.split())[:MAX_REASON] or "cancelled by hand: probably ours"
    resource, v = _probable(engine, providers, task_id, policy)
    resembled = v.create
    assert resembled is not None
    if shadow_modes().shadowed(resembled.provider_kind):
        raise OperatorError(f"task {task_id} resembles a create of {resembled.provider_kind}, which is in "
                            "shadow mode: recon_dagster cancels nothing of it")  # fmt: skip
    result = cancel(resource, v.task)
    fate = CANCEL_FATES[result]
    with engine.begin() as conn:
        create = ledger.record_task(conn, resembled.job_id, provider=v.task.provider,
                                    kind=resembled.provider_kind, task_id=v.task.task_id, create=resembled.id)  # fmt: skip
        ledger.set_fate(conn, create.id, fate, {"by": who, "why": why, "status": v.task.status},
                        replaces=[ledger.Fate.ATTACHED, *ledger.FOLLOWED])  # fmt: skip
        row = jobs_db.load_job(conn, resembled.job_id)
        if row is not None:
            record_action(conn, row, CANCEL, who, f"task {v.task.task_id} ({result.value}): {why}", run_id)
    return HandDone(v.task.task_id, resembled.job_id,
                    f"task {v.task.task_id} (resembling job {resembled.job_id}'s create {resembled.seq}): {result.value}")  # fmt: skip
