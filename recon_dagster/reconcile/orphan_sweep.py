"""The orphan sweep: list each provider's recent tasks, sort every one (``orphans.reconcile``), act.

For a provider that lists its tasks (``TaskListing``), each collection (Replicate's predictions,
its trainings) is walked and judged on its own: a failed list is reported and discards nothing
else. A listed task is ours by the create ledger's task id, by our job marker, or by a job row
naming it; one that only resembles an unanswered create by fingerprint is ``probably_ours``:
reported, never acted on. For a provider that cannot list (KIE), the ledger is the only record:
every task id it holds in the window that its job's row does not own is polled for its state.
Then, per task:

- without ``act`` nothing is written anywhere (no table, no cancel): the report says what would be;
- with ``act``, a task of a shadowed kind (``RECON_MODE`` / ``RECON_SHADOW_KINDS``) gets one
  ``reconcile_decisions`` row saying what enforce would do, and nothing else;
- with ``act`` in enforce: adopt (a compare-and-set of the job's task id), cancel upstream, an
  ``orphan_billed`` anomaly with the provider's reported cost, and the ledger's ``fate`` of the
  task (what really happened to a cancel: ``cancelled``, ``cancel_refused``, ``already_ended``,
  ``not_found``), each guarded so a second sweep, a late worker or the reconciler never
  double-acts. A task whose cancel did not stop it is followed until it ends.

An unanswered create at a listing provider is marked looked-at with the instant its collection's
walk began (a create whose answer is lost during the walk is not): the sweep of stale jobs waits
for that before failing and refunding its job. One that a listed task resembles is not: its job
waits for the operator (or ``RECON_ORPHAN_LOOK_WAIT_S``).
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
from sqlalchemy.dialects import postgresql as pg

from recon_dagster.core.kinds import KINDS
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
    resembles,
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
# What a cancel really did (a cancel the provider did not take is no ``cancelled``).
CANCEL_FATES = {
    CancelResult.CANCELLED: ledger.Fate.CANCELLED,
    CancelResult.ALREADY_ENDED: ledger.Fate.ALREADY_ENDED,
    CancelResult.NOT_FOUND: ledger.Fate.NOT_FOUND,
    CancelResult.REFUSED: ledger.Fate.CANCEL_REFUSED,
}
# The fates a later, truer fate replaces: a followed task's end; a cancelled task that billed anyway.
_REPLACES = {
    ledger.Fate.ORPHAN_BILLED: (ledger.Fate.ATTACHED, *ledger.FOLLOWED, ledger.Fate.CANCELLED),
    ledger.Fate.ENDED: (ledger.Fate.ATTACHED, *ledger.FOLLOWED),
    ledger.Fate.CANCELLED: (ledger.Fate.ATTACHED, *ledger.FOLLOWED),
    ledger.Fate.CANCEL_REFUSED: (ledger.Fate.ATTACHED, *ledger.FOLLOWED),
    ledger.Fate.ALREADY_ENDED: (ledger.Fate.ATTACHED, *ledger.FOLLOWED),
    ledger.Fate.NOT_FOUND: (ledger.Fate.ATTACHED, *ledger.FOLLOWED),
    ledger.Fate.ADOPTED: (ledger.Fate.ATTACHED,),
    ledger.Fate.HANDED_TO_SWEEP: (ledger.Fate.ATTACHED, ledger.Fate.ADOPTED, *ledger.FOLLOWED),
    ledger.Fate.ATTACHED: (),
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
                verdicts = _listed_verdicts(engine, name, resource, providers, since, now, policy, report)
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


def find_listed(
    engine: sa.Engine, providers: Any, task_id: str, policy: SweepPolicy, *, provider: str | None = None
) -> tuple[Any, OrphanVerdict] | None:
    """The resource and the verdict of ``task_id`` among the tasks the listing providers (or only
    ``provider``) show in the policy's window, judged as a dry run (nothing written); None when
    no list shows it. A failed list raises (the operator must not act on half a picture)."""
    dry = SweepPolicy(window=policy.window, grace=policy.grace, act=False, shadowed=policy.shadowed)
    now = datetime.now(UTC)
    for name, resource in resources(providers).items():
        if not isinstance(resource, TaskListing) or (provider is not None and name != provider):
            continue
        report = OrphanReport(since=now - dry.window, act=False)
        verdicts = _listed_verdicts(engine, name, resource, providers, now - dry.window, now, dry, report)
        if report.errors:
            raise ValueError("; ".join(f"{where}: {error}" for where, error in report.errors.items()))
        for v in verdicts:
            if v.task.task_id == task_id:
                return resource, v
    return None


def _walk(
    engine: sa.Engine, name: str, resource: TaskListing, since: datetime, report: OrphanReport
) -> tuple[list[UpstreamTask], dict[str, datetime], dict[str, str]]:
    """Each collection's tasks, walked on its own: (every task listed, when each collection that
    was listed whole began its walk, each provider kind's collection). A failed collection is
    reported and left out; the others stand."""
    tasks: list[UpstreamTask] = []
    began: dict[str, datetime] = {}
    collection_of: dict[str, str] = {}
    for collection, kinds in resource.task_collections().items():
        collection_of.update(dict.fromkeys(kinds, collection))
        try:
            with engine.connect() as conn:
                start = ledger.look_began(conn)  # before the first page: the newest it can show
            listed = list(resource.list_collection(collection, created_after=since))
        except (ProviderError, ValueError) as exc:
            report.errors[f"{name}/{collection}"] = f"{type(exc).__name__}: {exc}"
            log.warning("orphan sweep: %s/%s not listed: %s", name, collection, exc)
            continue
        began[collection] = start
        tasks.extend(listed)
        report.listed[name] += len(listed)
    return tasks, began, collection_of


def _listed_verdicts(
    engine: sa.Engine, name: str, resource: TaskListing, providers: Any, since: datetime, now: datetime,
    policy: SweepPolicy, report: OrphanReport,
) -> list[OrphanVerdict]:  # fmt: skip
    tasks, began, collection_of = _walk(engine, name, resource, since, report)
    with engine.connect() as conn:
        held = ledger.by_task_ids(conn, name, {t.task_id for t in tasks})
        marked = {
            t.task_id: m for t in tasks if t.task_id not in held and (m := ledger.parse_marker(t.marker))
        }
        by_marker = ledger.by_ids(conn, {ledger.create_id(*m) for m in marked.values()})
        unanswered = ledger.unanswered(conn, name, since)
        followed = ledger.followed(conn, name)
    creates: dict[str, ledger.Create] = dict(held)
    for task_id, (job, seq) in marked.items():
        if (c := by_marker.get(ledger.create_id(job, seq))) is not None and c.provider == name:
            creates[task_id] = c
    with engine.connect() as conn:
        named = jobs_naming(conn, name, [t.task_id for t in tasks if t.task_id not in creates])
    claimed = {c.id for c in creates.values()}
    loose = [t for t in tasks if t.task_id not in creates and t.task_id not in named]
    resembled = match_unanswered(loose, [u for u in unanswered if u.id not in claimed], MATCH_WINDOW)
    # A task whose cancel did not stop it, no longer listed in the window (older): polled.
    listed_ids = {t.task_id for t in tasks}
    for c in followed:
        coll = collection_of.get(c.provider_kind)
        if c.task_id in listed_ids or coll not in began:
            continue
        if (polled := _polled(providers, name, c, coll)) is not None:
            tasks.append(polled)
            creates[polled.task_id] = c
    if policy.act and unanswered:
        unsure = {c.id for c in resembled.values()}
        _mark_looked(engine, [u for u in unanswered if u.id not in unsure], began, collection_of, report)
    return _judge(engine, tasks, creates, now, policy, named=named, resembled=resembled)


def _mark_looked(
    engine: sa.Engine, unanswered: list[ledger.Create], began: dict[str, datetime],
    collection_of: dict[str, str], report: OrphanReport,
) -> None:  # fmt: skip
    """Each unanswered create looked for as of its own collection's walk start; a create of a
    kind no collection holds, as of the earliest, only when every collection was listed."""
    whole = len(began) == len(set(collection_of.values())) and began
    by_stamp: dict[datetime, list[uuid.UUID]] = {}
    for u in unanswered:
        coll = collection_of.get(u.provider_kind)
        stamp = began.get(coll) if coll is not None else (min(began.values()) if whole else None)
        if stamp is not None:
            by_stamp.setdefault(stamp, []).append(u.id)
    with engine.begin() as conn:
        for stamp, ids in by_stamp.items():
            report.looked += ledger.mark_looked(conn, ids, stamp)


def _polled(providers: Any, name: str, c: ledger.Create, collection: str | None) -> UpstreamTask | None:
    """A ledger task's state by a poll (None when the poll failed: it is looked at next time)."""
    assert c.task_id is not None
    try:
        polled = providers.poll(c.provider_kind, c.task_id)
    except ProviderError as exc:
        log.warning("orphan sweep: %s task %s not polled: %s", name, c.task_id, exc)
        return None
    state = polled.state.value
    return UpstreamTask(
        name, c.task_id, collection or c.provider_kind, phase_of_poll(state), state, c.task_recorded_at
    )


_JOBS_NAMING = sql(
    """
    SELECT id FROM jobs WHERE provider_task_id = ANY(:t) AND provider_kind = ANY(:k)
    """
).bindparams(sa.bindparam("t", type_=pg.ARRAY(sa.Text)), sa.bindparam("k", type_=pg.ARRAY(sa.Text)))


def jobs_naming(conn: sa.Connection, provider: str, task_ids: list[str]) -> dict[str, JobRow]:
    """The job rows of ``provider``'s kinds naming any of ``task_ids`` (``jobs.provider_task_id``,
    as the spec's contract has a worker write it), by task id: the row is proof of ownership."""
    if not task_ids:
        return {}
    kinds = [k for k, spec in KINDS.items() if str(spec.provider) == provider]
    ids = conn.execute(_JOBS_NAMING, {"t": task_ids, "k": kinds}).scalars().all()
    rows = jobs_db.load_jobs(conn, {uuid.UUID(str(i)) for i in ids})
    return {r.provider_task_id: r for r in rows if r.provider_task_id}


def _ledger_verdicts(
    engine: sa.Engine, name: str, providers: Any, since: datetime, now: datetime, policy: SweepPolicy
) -> list[OrphanVerdict]:
    """A provider without a list: the ledger's task ids in the window (and those still followed)
    that their job's row does not own, each polled for its state."""
    with engine.connect() as conn:
        recorded = ledger.unjudged_tasks(conn, name, since)
        rows = {r.id: r for r in jobs_db.load_jobs(conn, {c.job_id for c in recorded})}
    tasks: list[UpstreamTask] = []
    creates: dict[str, ledger.Create] = {}
    for c in recorded:
        row = rows.get(c.job_id)
        assert c.task_id is not None
        task: UpstreamTask | None
        if (
            row is not None
            and row.provider_task_id == c.task_id
            and (row.inflight or row.status == "completed")
        ):
            # Its job owns it (the reconciler polls it): no poll of ours.
            task = UpstreamTask(name, c.task_id, c.provider_kind, phase_of_poll("running"), "named by its job",
                                c.task_recorded_at)  # fmt: skip
        elif (task := _polled(providers, name, c, None)) is None:
            continue
        tasks.append(task)
        creates[c.task_id] = c
    return _judge(engine, tasks, creates, now, policy)


def _judge(
    engine: sa.Engine, tasks: list[UpstreamTask], creates: dict[str, ledger.Create], now: datetime,
    policy: SweepPolicy, *, named: dict[str, JobRow] | None = None,
    resembled: dict[str, ledger.Create] | None = None,
) -> list[OrphanVerdict]:  # fmt: skip
    named, resembled = named or {}, resembled or {}
    wanted = {c.job_id for c in creates.values()} | {c.job_id for c in resembled.values()}
    with engine.connect() as conn:
        rows = {r.id: r for r in jobs_db.load_jobs(conn, wanted)}
    verdicts = []
    for t in tasks:
        if (c := creates.get(t.task_id)) is not None:
            verdicts.append(reconcile(t, c, rows.get(c.job_id), now=now, grace=policy.grace))
        elif (row := named.get(t.task_id)) is not None:
            verdicts.append(reconcile(t, None, row, now=now, grace=policy.grace))
        elif (c := resembled.get(t.task_id)) is not None:
            verdicts.append(resembles(t, c, rows.get(c.job_id)))
        else:
            verdicts.append(reconcile(t, None, None, now=now, grace=policy.grace))
    return verdicts


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
    if v.action is OrphanAction.PROBABLY_OURS:
        return SweptTask(v, "reported: the operator adopts or cancels it")
    if v.action in (OrphanAction.UNKNOWN, OrphanAction.WAIT):
        return SweptTask(v, "reported" if v.action is OrphanAction.UNKNOWN else "left to its worker")
    if not policy.act:
        return SweptTask(v, f"would {v.action.value}" if v.action in ACTING else "nothing to do")
    if v.action in ACTING and policy.shadowed(v.kind):
        return SweptTask(
            v, "shadow: recorded" if record_shadow(engine, v, policy.run_id) else "shadow: already recorded"
        )
    assert v.job_id is not None
    create = v.create
    settled = _ACTION_FATES[v.action]
    if (
        create is not None
        and create.fate == settled.value
        and v.action is not OrphanAction.CANCEL
        and create.task_id == v.task.task_id
    ):
        return SweptTask(v, f"already {settled.value}")  # judged by an earlier sweep: nothing new
    kind = create.provider_kind if create is not None else v.kind or ""
    with engine.begin() as conn:  # the task id is the ledger's from now on, whatever follows
        create = ledger.record_task(conn, v.job_id, provider=v.task.provider, kind=kind,
                                    task_id=v.task.task_id, create=create.id if create else None)  # fmt: skip
    done = "recorded"
    fate = settled
    if v.action is OrphanAction.ADOPT:
        with engine.begin() as conn:
            won = adopt(conn, v.job_id, v.kind or create.provider_kind, v.task)
        if not won:
            return SweptTask(v, "lost the race: the job changed since (the next sweep looks again)")
        done = "adopted"
    elif v.action is OrphanAction.CANCEL:
        result = cancel(resource, v.task)
        fate = CANCEL_FATES[result]
        done = "cancelled" if result is CancelResult.CANCELLED else f"cancel: {result.value}"
        if fate in ledger.FOLLOWED:
            done += " (still followed until it ends)"
            _billed_anomaly(engine, v, "orphan_running")
    elif v.action is OrphanAction.ORPHAN_BILLED:
        _billed_anomaly(engine, v, ORPHAN_BILLED)
        done = "reported (orphan_billed anomaly)"
    with engine.begin() as conn:
        ledger.set_fate(conn, create.id, fate, {"status": v.task.status, "metrics": v.cost, "done": done},
                        replaces=_REPLACES[fate])  # fmt: skip
    return SweptTask(v, done)


def cancel(resource: Any, task: UpstreamTask) -> CancelResult:
    """Cancel ``task`` upstream; a provider without a cancel refuses."""
    if not isinstance(resource, TaskCancelling):
        return CancelResult.REFUSED
    return resource.cancel_task(task.collection, task.task_id)


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
