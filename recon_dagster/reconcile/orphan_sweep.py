"""The orphan sweep: list each provider's recent tasks, sort every one (``orphans.reconcile``), act.

For a provider that lists its tasks (``TaskListing``), the window's tasks are matched to the create
ledger by task id, by job marker, or (for a create whose answer was lost) by fingerprint. For one
that cannot (KIE), the ledger is the only record: every task id it holds in the window that its
job's row does not name is polled for its state. Then, per task:

- without ``act`` nothing is written anywhere (no table, no cancel): the report says what would be;
- with ``act``, a task of a shadowed kind (``RECON_MODE`` / ``RECON_SHADOW_KINDS``) gets one
  ``reconcile_decisions`` row saying what enforce would do, and nothing else;
- with ``act`` in enforce: adopt (a compare-and-set of the job's task id), cancel upstream, an
  ``orphan_billed`` anomaly with the provider's reported cost, and the ledger's ``fate`` of the
  task, each guarded so a second sweep, a late worker or the reconciler never double-acts.

An unanswered create at a listing provider whose window was listed whole is marked looked-at:
the sweep of stale jobs waits for that before failing and refunding its job.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from recon_dagster.core.types import JobRow
from recon_dagster.db import credits, ledger
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.sqltext import sql
from recon_dagster.providers.status import ProviderError
from recon_dagster.providers.upstream_tasks import CancelResult, TaskCancelling, TaskListing, UpstreamTask
from recon_dagster.reconcile.orphans import (
    ACTING,
    OrphanAction,
    OrphanVerdict,
    match_unanswered,
    phase_of_poll,
    reconcile,
    resources,
)

log = logging.getLogger("recon_dagster.reconcile.orphan_sweep")

ORPHAN_BILLED = "orphan_billed"
# A create's task is looked for this long after its intent (a queue, a slow answer).
MATCH_WINDOW = timedelta(minutes=10)
_ACTION_FATES = {
    OrphanAction.OWNED: ledger.Fate.ATTACHED,
    OrphanAction.ADOPT: ledger.Fate.ADOPTED,
    OrphanAction.CANCEL: ledger.Fate.CANCELLED,
    OrphanAction.ORPHAN_BILLED: ledger.Fate.ORPHAN_BILLED,
    OrphanAction.ENDED: ledger.Fate.ENDED,
}


@dataclass(frozen=True)
class SweptTask:
    """One task's verdict and what the sweep did about it."""

    verdict: OrphanVerdict
    done: str  # what happened: "would cancel", "cancelled", "shadow: recorded", "lost the race", ...

    def to_json(self) -> dict[str, Any]:
        v, t = self.verdict, self.verdict.task
        return {
            "provider": t.provider, "collection": t.collection, "task_id": t.task_id, "status": t.status,
            "created_at": t.created_at.isoformat() if t.created_at else None,
            "action": v.action.value, "reason": v.reason, "done": self.done,
            "job_id": str(v.job_id) if v.job_id else None, "kind": v.kind, "cost": v.cost,
        }  # fmt: skip


@dataclass
class OrphanReport:
    since: datetime
    act: bool
    tasks: list[SweptTask] = field(default_factory=list)
    listed: Counter[str] = field(default_factory=Counter)
    errors: dict[str, str] = field(default_factory=dict)
    looked: int = 0
    seconds: float = 0.0

    def counts(self) -> Counter[str]:
        return Counter(s.verdict.action.value for s in self.tasks)

    def to_json(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat(), "act": self.act, "seconds": round(self.seconds, 3),
            "listed": dict(self.listed), "counts": dict(self.counts()), "errors": self.errors,
            "looked_for_unanswered_creates": self.looked,
            "tasks": [s.to_json() for s in self.tasks if s.verdict.action is not OrphanAction.OWNED],
        }  # fmt: skip

    def to_text(self) -> str:
        listed = ", ".join(f"{p} {n}" for p, n in sorted(self.listed.items())) or "none"
        counts = ", ".join(f"{a} {n}" for a, n in sorted(self.counts().items())) or "nothing"
        mode = "acting" if self.act else "dry run: nothing written, nothing cancelled (--act to act)"
        lines = [
            f"orphans since {self.since:%Y-%m-%d %H:%M:%S} UTC ({mode}); tasks listed: {listed}; {counts}"
        ]
        for s in self.tasks:
            if s.verdict.action is OrphanAction.OWNED:
                continue
            t, v = s.verdict.task, s.verdict
            cost = f" cost {v.cost}" if v.cost and v.action is OrphanAction.ORPHAN_BILLED else ""
            lines.append(f"  {v.action.value:<13} {t.provider}/{t.collection} {t.task_id} [{t.status}] "
                         f"{s.done}: {v.reason}{cost}")  # fmt: skip
        for provider, error in sorted(self.errors.items()):
            lines.append(f"  error: {provider}: {error}")
        return "\n".join(lines)


@dataclass(frozen=True)
class SweepPolicy:
    """What the caller read from the settings (the domain reads none)."""

    window: timedelta
    grace: timedelta
    act: bool
    shadowed: Callable[[str | None], bool]
    run_id: str | None = None


def sweep_orphans(
    engine: sa.Engine, providers: Any, policy: SweepPolicy, *, now: datetime | None = None
) -> OrphanReport:
    """One pass over every provider; one provider's error never stops the others."""
    started = time.monotonic()
    now = now or datetime.now(UTC)
    since = now - policy.window
    report = OrphanReport(since=since, act=policy.act)
    for name, resource in resources(providers).items():
        try:
            if isinstance(resource, TaskListing):
                verdicts = _listed_verdicts(engine, name, resource, since, now, policy, report)
            else:
                verdicts = _ledger_verdicts(engine, name, providers, since, now, policy)
            settled = _settle_owned(engine, verdicts) if policy.act else set()
            report.tasks.extend(
                SweptTask(v, "attached") if id(v) in settled else _act(engine, resource, v, policy)
                for v in verdicts
            )
        except (ProviderError, ValueError, sa.exc.SQLAlchemyError) as exc:
            report.errors[name] = f"{type(exc).__name__}: {exc}"
            log.warning("orphan sweep: %s: %s", name, exc)
    report.seconds = time.monotonic() - started
    return report


def _listed_verdicts(
    engine: sa.Engine, name: str, resource: TaskListing, since: datetime, now: datetime,
    policy: SweepPolicy, report: OrphanReport,
) -> list[OrphanVerdict]:  # fmt: skip
    tasks = list(resource.list_tasks(created_after=since))
    report.listed[name] += len(tasks)
    with engine.connect() as conn:
        held = ledger.by_task_ids(conn, name, {t.task_id for t in tasks})
        marked = {
            t.task_id: m for t in tasks if t.task_id not in held and (m := ledger.parse_marker(t.marker))
        }
        by_marker = ledger.by_ids(conn, {ledger.create_id(*m) for m in marked.values()})
        unanswered = ledger.unanswered(conn, name, since)
    creates: dict[str, ledger.Create] = dict(held)
    for task_id, (job, seq) in marked.items():
        if (c := by_marker.get(ledger.create_id(job, seq))) is not None and c.provider == name:
            creates[task_id] = c
    claimed = {c.id for c in creates.values()}
    loose = [t for t in tasks if t.task_id not in creates]
    for task_id, c in match_unanswered(
        loose, [u for u in unanswered if u.id not in claimed], MATCH_WINDOW
    ).items():
        creates[task_id] = c
    if policy.act and unanswered:
        with engine.begin() as conn:
            report.looked += ledger.mark_looked(conn, [u.id for u in unanswered])
    return _judge(engine, tasks, creates, now, policy)


def _ledger_verdicts(
    engine: sa.Engine, name: str, providers: Any, since: datetime, now: datetime, policy: SweepPolicy
) -> list[OrphanVerdict]:
    """A provider without a list: the ledger's task ids in the window that their job's row does
    not name, each polled for its state."""
    with engine.connect() as conn:
        recorded = ledger.unjudged_tasks(conn, name, since)
        rows = {r.id: r for r in jobs_db.load_jobs(conn, {c.job_id for c in recorded})}
    tasks: list[UpstreamTask] = []
    creates: dict[str, ledger.Create] = {}
    for c in recorded:
        row = rows.get(c.job_id)
        assert c.task_id is not None
        if row is not None and row.provider_task_id == c.task_id:
            phase, status = phase_of_poll("running"), "named by its job"
        else:
            try:
                polled = providers.poll(c.provider_kind, c.task_id)
            except ProviderError as exc:  # this task is looked at again next time
                log.warning("orphan sweep: %s task %s not polled: %s", name, c.task_id, exc)
                continue
            phase, status = phase_of_poll(polled.state.value), polled.state.value
        tasks.append(UpstreamTask(name, c.task_id, c.provider_kind, phase, status, c.task_recorded_at))
        creates[c.task_id] = c
    return _judge(engine, tasks, creates, now, policy)


def _judge(
    engine: sa.Engine, tasks: list[UpstreamTask], creates: dict[str, ledger.Create], now: datetime,
    policy: SweepPolicy,
) -> list[OrphanVerdict]:  # fmt: skip
    with engine.connect() as conn:
        rows = {r.id: r for r in jobs_db.load_jobs(conn, {c.job_id for c in creates.values()})}
    return [
        reconcile(t, c, rows.get(c.job_id) if c else None, now=now, grace=policy.grace)
        for t in tasks
        for c in [creates.get(t.task_id)]
    ]


def _settle_owned(engine: sa.Engine, verdicts: list[OrphanVerdict]) -> set[int]:
    """Tasks their job names, already in the ledger: their fate in one statement (most of what a
    sweep lists), not a transaction each. Returns the ``id()`` of the verdicts settled."""
    owned = [
        v for v in verdicts
        if v.action is OrphanAction.OWNED and v.create is not None and v.create.task_id == v.task.task_id
    ]  # fmt: skip
    fresh = [v.create.id for v in owned if v.create is not None and v.create.fate is None]
    if fresh:
        with engine.begin() as conn:
            ledger.set_fates(conn, fresh, ledger.Fate.ATTACHED)
    return {id(v) for v in owned}


def _act(engine: sa.Engine, resource: Any, v: OrphanVerdict, policy: SweepPolicy) -> SweptTask:
    if v.action in (OrphanAction.UNKNOWN, OrphanAction.WAIT):
        return SweptTask(v, "reported" if v.action is OrphanAction.UNKNOWN else "left to its worker")
    if not policy.act:
        return SweptTask(v, f"would {v.action.value}" if v.action in ACTING else "nothing to do")
    if v.action in ACTING and policy.shadowed(v.kind):
        return SweptTask(
            v, "shadow: recorded" if record_shadow(engine, v, policy.run_id) else "shadow: already recorded"
        )
    create = v.create
    assert create is not None and v.job_id is not None
    settled = _ACTION_FATES[v.action]
    if (
        create.fate == settled.value
        and v.action is not OrphanAction.CANCEL
        and create.task_id == v.task.task_id
    ):
        return SweptTask(v, f"already {settled.value}")  # judged by an earlier sweep: nothing new
    with engine.begin() as conn:  # the task id is the ledger's from now on, whatever follows
        create = ledger.record_task(conn, v.job_id, provider=v.task.provider, kind=create.provider_kind,
                                    task_id=v.task.task_id, create=create.id)  # fmt: skip
    done = "recorded"
    if v.action is OrphanAction.ADOPT:
        with engine.begin() as conn:
            won = adopt(conn, v.job_id, v.kind or create.provider_kind, v.task)
        if not won:
            return SweptTask(v, "lost the race: the job changed since (the next sweep looks again)")
        done = "adopted"
    elif v.action is OrphanAction.CANCEL:
        if not isinstance(resource, TaskCancelling):
            done = f"cannot cancel at {v.task.provider}: reported"
            _billed_anomaly(engine, v, "orphan_running")
        else:
            result = resource.cancel_task(v.task.collection, v.task.task_id)
            done = "cancelled" if result is CancelResult.CANCELLED else f"cancel: {result.value}"
    elif v.action is OrphanAction.ORPHAN_BILLED:
        _billed_anomaly(engine, v, ORPHAN_BILLED)
        done = "reported (orphan_billed anomaly)"
    fate = _ACTION_FATES[v.action]
    with engine.begin() as conn:
        ledger.set_fate(conn, create.id, fate, {"status": v.task.status, "metrics": v.cost, "done": done},
                        replaces=[ledger.Fate.ATTACHED] if fate is not ledger.Fate.ATTACHED else ())  # fmt: skip
    return SweptTask(v, done)


def adopt(conn: sa.Connection, job_id: uuid.UUID, kind: str, task: UpstreamTask) -> bool:
    """Attach ``task`` to an in-flight job that has no task id (compare-and-set), due at once."""
    r = conn.execute(
        sql(
            """
            UPDATE jobs SET provider_task_id = :t, provider_kind = :k,
              provider_call_started_at = COALESCE(provider_call_started_at, CAST(:created AS timestamptz), now()),
              reconcile_next_at = NULL, updated_at = now()
            WHERE id = :j AND status IN ('pending', 'processing') AND provider_task_id IS NULL
            RETURNING id
            """
        ),
        {"j": str(job_id), "t": task.task_id, "k": kind, "created": task.created_at},
    ).first()
    return r is not None


def _billed_anomaly(engine: sa.Engine, v: OrphanVerdict, reason: str) -> None:
    with engine.begin() as conn:
        row: JobRow | None = jobs_db.load_job(conn, v.job_id) if v.job_id else None
        credits.log_credit_anomaly(
            conn, job_id=v.job_id, user_id=row.user_id if row else None, reason=reason,
            details={
                "provider": v.task.provider, "collection": v.task.collection, "task_id": v.task.task_id,
                "status": v.task.status, "cost": v.cost, "kind": v.kind,
                "created_at": v.task.created_at, "completed_at": v.task.completed_at,
            },
        )  # fmt: skip


_SHADOW = sql(
    """
    INSERT INTO reconcile_decisions (job_id, provider_kind, attempt, upstream, action, reason, run_id, mode)
    SELECT :j, :k, 0, :up, :act, :why, :run, 'shadow'
    WHERE NOT EXISTS (SELECT 1 FROM reconcile_decisions WHERE job_id = :j AND action = :act AND upstream = :up)
    RETURNING id
    """
)


def record_shadow(engine: sa.Engine, v: OrphanVerdict, run_id: str | None) -> bool:
    """What enforce would do to this task, once per (job, action, task)."""
    with engine.begin() as conn:
        r = conn.execute(
            _SHADOW,
            {
                "j": str(v.job_id), "k": v.kind, "up": f"{v.task.status} {v.task.task_id}"[:200],
                "act": f"orphan_{v.action.value}", "why": v.reason[:2000], "run": run_id,
            },
        ).first()  # fmt: skip
    return r is not None
