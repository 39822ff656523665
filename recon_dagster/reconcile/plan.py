"""``recon-dagster plan``: what the next tick would do to every job and every credit, writing nothing.

The plan is the reconciler's own decision code run read-only: the sensor's and the sweep's stale
scan (``scan_stale``), the reconciler's poll phase (``Reconciler.poll``: route, one poll per job
through the same provider resource and its account budgets, the not-found breaker's judgement),
the attempt cap (``decide_after_attempt``), and the settle rules of ``db/credits.py`` applied to
the job's ``reserved`` usage logs (which log is committed, which refunded, to which pool).

Nothing is written: the database reads run in a READ ONLY transaction, the breaker judges without
recording (``ReadOnlyBreaker``), a non-finite timestamp is not flagged, the media store is never
built. The only rows a polling plan touches are the provider account's rate-limit tokens
(``provider_limit_*``): spending them is what keeps the plan's polls within the budget the daemon
shares (``--no-poll`` touches none).
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from recon_dagster.core.kinds import NON_PROVIDER_JOB_TYPES
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.credits import split_refund, valid_amount
from recon_dagster.db.jobs import JobRow
from recon_dagster.media.store import MediaStore
from recon_dagster.providers.status import UpstreamState, UpstreamStatus
from recon_dagster.reconcile.breaker import NotFoundBreaker, provider_of, window_counts
from recon_dagster.reconcile.decide import (
    Action,
    Decision,
    Outcome,
    Route,
    decide_after_attempt,
    decide_on_status,
    not_found_breaker_open,
    refused_before_download,
    route,
)
from recon_dagster.reconcile.reconciler import Polled, Reconciler, ReconcileSettings, Step, Upstream


class PlanAction(StrEnum):
    """What reconciliation would do to one job (the plan's and the shadow decisions' vocabulary)."""

    COMPLETE = "complete"  # upstream succeeded: complete, store media, commit the reservation
    FAIL = "fail"  # upstream failed / lost the task / result expired: fail + refund
    SWEEP = "sweep"  # nothing to poll (sync, no task id, unknown kind): fail + refund
    COUNT = "count"  # this attempt errored: count it
    FORCE_FAIL = "force_fail"  # the attempt that reaches the cap: force-fail + refund
    POLL = "poll"  # --no-poll: the row alone cannot decide, upstream would be asked
    DEFER = "defer"  # the poll was not sent (its account's limiter refused it): rescheduled, no attempt
    CLAMP = "clamp"  # a lease / next attempt beyond what we ever write: clamped by the sweep (shadow)
    LEAVE = "leave_alone"  # not due (lease, cadence, threshold), or still running below the cap


REFUNDING = frozenset({PlanAction.FAIL, PlanAction.SWEEP, PlanAction.FORCE_FAIL})


@dataclass(frozen=True)
class Money:
    """Credits one job's settlement would move: committed, and refunded per pool."""

    commit: Decimal = Decimal(0)
    refund_sub: Decimal = Decimal(0)
    refund_topup: Decimal = Decimal(0)

    def __add__(self, other: Money) -> Money:
        return Money(
            self.commit + other.commit,
            self.refund_sub + other.refund_sub,
            self.refund_topup + other.refund_topup,
        )

    @property
    def refund(self) -> Decimal:
        return self.refund_sub + self.refund_topup

    def text(self) -> str:
        parts = []
        if self.commit:
            parts.append(f"commit {_num(self.commit)}")
        if self.refund:
            parts.append(f"refund {_num(self.refund_sub)} sub + {_num(self.refund_topup)} top-up")
        return ", ".join(parts) or "-"


@dataclass(frozen=True)
class ReservedLog:
    id: uuid.UUID
    amount: object
    metadata: object


def settlement(action: PlanAction, logs: Sequence[ReservedLog]) -> Money:
    """The credits ``commit_job_credits`` / ``refund_reserved_credits_for_job`` would move for
    these ``reserved`` logs (oldest first): completing commits the oldest usable log and refunds
    the others; failing refunds them all; a log whose amount is not a number moves nothing."""
    usable = [(lg, a) for lg in logs if (a := valid_amount(lg.amount)) is not None]
    if action is PlanAction.COMPLETE:
        if not usable:
            return Money()
        (_, first), rest = usable[0], usable[1:]
        return Money(commit=first) + _refunds(rest)
    if action in REFUNDING:
        return _refunds(usable)
    return Money()


def _refunds(usable: Iterable[tuple[ReservedLog, Decimal]]) -> Money:
    total = Money()
    for lg, amount in usable:
        to_sub, to_topup, _ = split_refund(amount, lg.metadata or {})
        total = total + Money(refund_sub=to_sub, refund_topup=to_topup)
    return total


def action_for(step: Step, outcome: Outcome, attempts_after: int, max_attempts: int) -> PlanAction:
    """The plan's name for what the act phase does with a polled job (``attempts_after``: the
    counter once this attempt is counted)."""
    if step is Step.FINALIZE:
        return PlanAction.COMPLETE
    if step is Step.FAIL:
        return PlanAction.FAIL
    if step is Step.SWEEP:
        return PlanAction.SWEEP
    if step is Step.DEFER:
        return PlanAction.DEFER
    if decide_after_attempt(attempts_after, max_attempts) is Action.FORCE_FAIL:
        return PlanAction.FORCE_FAIL
    return PlanAction.LEAVE if outcome is Outcome.STILL_RUNNING else PlanAction.COUNT


def upstream_answer(status: UpstreamStatus | None, reason: str = "", step: Step | None = None) -> str:
    if step is Step.DEFER:
        return "not sent"
    if status is None:
        return "error" if reason.startswith("poll failed") else "-"
    progress = f" {status.progress}%" if status.progress is not None else ""
    return f"{status.state.value}{progress}"


# --- read-only pieces of the reconciler ------------------------------------------------------------


class ReadOnlyBreaker(NotFoundBreaker):
    """The not-found breaker judging without recording: the window as stored, plus this plan's own
    answers so far (a plan that meets a burst sees the breaker open as the run would)."""

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        # (provider, kind or None for the provider's totals, not_found) -> answers this plan saw.
        self._seen: Counter[tuple[str, str | None, bool]] = Counter()

    def judge(self, status: UpstreamStatus) -> Decision:
        kind = status.provider_kind
        provider = provider_of(kind)
        not_found = status.state is UpstreamState.NOT_FOUND
        with self._lock:
            for key in (kind, None):
                self._seen[provider, key, not_found] += 1
            mine = {
                key: (
                    self._seen[provider, key, True],
                    self._seen[provider, key, True] + self._seen[provider, key, False],
                )
                for key in (kind, None)
            }
        if not not_found:
            return decide_on_status(status)
        with self.engine.connect() as conn:
            stored = window_counts(conn, self.policy.window_s, provider)
        # As the run judges: against the kind's window and the provider's, open if either is.
        breaker_open = False
        for key in (kind, None):
            nf, n = stored.get((provider, key), (0, 0))
            mine_nf, mine_all = mine[key]
            breaker_open |= not_found_breaker_open(nf + mine_nf, n + mine_all, self.policy)
        return decide_on_status(status, breaker_open=breaker_open)

    def record_error(self, provider_kind: str, exc: BaseException) -> None:
        return None

    def flush(self) -> None:
        return None


class ReadOnlyReconciler(Reconciler):
    """The real poll phase with its two bookkeeping writes turned off (breaker answers, the
    non-finite timestamp anomaly). Only ``poll`` may be called: it has no media store."""

    def __init__(self, engine: sa.Engine, upstream: Upstream, settings: ReconcileSettings) -> None:
        # A plan never waits for its account: a poll the limiter does not let out now is shown
        # as ``defer`` (a run would wait for it within its account wait, then poll).
        super().__init__(
            engine,
            upstream,
            cast(MediaStore, None),
            settings=replace(settings, account_wait=timedelta(0)),
            breaker=ReadOnlyBreaker(engine),
        )

    def _flag_nonfinite(self, row: JobRow) -> None:
        return None


class _Unpolled:
    """``--no-poll``: any poll is a bug (rows routed to a poll are decided as ``poll``)."""

    def poll(self, kind: str, task_id: str) -> UpstreamStatus:
        raise AssertionError("plan --no-poll must not poll")

    def media_headers(self, kind: str, ref: Any) -> Mapping[str, str]:
        return {}


# --- the plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedJob:
    job_id: str
    kind: str | None
    age_s: float | None
    attempt: int
    upstream: str
    action: PlanAction
    reason: str
    money: Money = Money()


@dataclass
class Plan:
    jobs: list[PlannedJob] = field(default_factory=list)

    def by_action(self) -> Counter[str]:
        return Counter(j.action.value for j in self.jobs)

    def by_kind(self) -> dict[str, Counter[str]]:
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for j in self.jobs:
            out[j.kind or "(none)"][j.action.value] += 1
        return dict(sorted(out.items()))

    def money(self) -> Money:
        total = Money()
        for j in self.jobs:
            total = total + j.money
        return total

    def to_json(self) -> dict[str, Any]:
        m = self.money()
        return {
            "jobs": [
                {**asdict(j), "action": j.action.value, "money": _money_json(j.money)} for j in self.jobs
            ],
            "totals": {
                "by_action": dict(sorted(self.by_action().items())),
                "by_kind": {k: dict(sorted(c.items())) for k, c in self.by_kind().items()},
                "credits": _money_json(m),
            },
        }


def _money_json(m: Money) -> dict[str, str]:
    return {
        "commit": str(m.commit),
        "refund_subscription": str(m.refund_sub),
        "refund_topup": str(m.refund_topup),
    }


_RESERVED_SQL = sa.text(
    """
    SELECT job_id, id, amount, metadata FROM usage_logs
    WHERE job_id = ANY(:ids) AND status = 'reserved'
    ORDER BY job_id, created_at, id
    """
).bindparams(sa.bindparam("ids", type_=pg.ARRAY(pg.UUID)))


# The shadow decisions enforce would have counted as attempts: still running (leave_alone) and
# errored (count). Shadow writes no attempt counter, so these are how it knows where a job stands.
COUNTED = frozenset({PlanAction.COUNT, PlanAction.LEAVE})
_SHADOW_ATTEMPTS_SQL = sa.text(
    f"""
    SELECT job_id, count(*) AS n FROM reconcile_decisions
    WHERE job_id = ANY(:ids) AND mode = 'shadow' AND action IN ({", ".join(f"'{a.value}'" for a in sorted(COUNTED))})
    GROUP BY job_id
    """
).bindparams(sa.bindparam("ids", type_=pg.ARRAY(pg.UUID)))


def shadow_attempts(conn: sa.Connection, job_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, int]:
    """Per job, the attempts its shadow decisions so far stand for (from ``reconcile_decisions``,
    never from the job row: shadow writes none)."""
    if not job_ids:
        return {}
    rows = conn.execute(_SHADOW_ATTEMPTS_SQL, {"ids": [str(j) for j in job_ids]})
    return {uuid.UUID(str(r.job_id)): int(r.n) for r in rows}


def reserved_logs(conn: sa.Connection, job_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, list[ReservedLog]]:
    """Every job's ``reserved`` usage logs in the settle functions' order, read without a lock."""
    out: dict[uuid.UUID, list[ReservedLog]] = defaultdict(list)
    if job_ids:
        for r in conn.execute(_RESERVED_SQL, {"ids": [str(j) for j in job_ids]}):
            out[uuid.UUID(str(r.job_id))].append(ReservedLog(r.id, r.amount, r.metadata))
    return out


_NON_PROVIDER = ", ".join(f"'{t}'" for t in NON_PROVIDER_JOB_TYPES)

# In-flight jobs the scan did not return, and why they are not due (the first reason that holds).
_NOT_DUE_SQL = sa.text(
    f"""
    SELECT id, provider_kind, reconcile_attempts,
      EXTRACT(EPOCH FROM now() - CASE WHEN isfinite(COALESCE(provider_call_started_at, started_at, created_at))
        THEN COALESCE(provider_call_started_at, started_at, created_at) END) AS age_s,
      CASE
        WHEN reconcile_lease_expires_at > now() THEN 'leased by ' || reconcile_lease_owner
        WHEN reconcile_next_at > now() THEN 'waiting out the reconcile cadence'
        WHEN provider_kind IS NULL AND job_type IN ({_NON_PROVIDER}) THEN 'pipeline job: never reconciled'
        WHEN provider_task_id IS NULL AND EXISTS (SELECT 1 FROM characters c WHERE c.training_job_id = jobs.id
          AND c.training_status IN ('pending', 'training') AND c.replicate_training_id IS NOT NULL)
          THEN 'legacy LoRA training: adopted by the sweep first'
        ELSE 'not past its stale threshold yet' END AS why
    FROM jobs
    WHERE status IN ('pending', 'processing') AND NOT (id = ANY(:due))
      AND (CAST(:kind AS text) IS NULL OR provider_kind = :kind)
    ORDER BY created_at, id
    LIMIT :limit
    """
).bindparams(sa.bindparam("due", type_=pg.ARRAY(pg.UUID)))


def build_plan(
    engine: sa.Engine,
    upstream: Upstream | None,
    settings: ReconcileSettings,
    *,
    kind: str | None = None,
    limit: int = 5000,
    busy: Collection[uuid.UUID] = (),
    shadowed: Callable[[str | None], bool] | None = None,
) -> Plan:
    """What the next tick would do to each in-flight job (of ``kind``); ``upstream`` None: no poll.

    ``busy``: jobs already carried by queued or running reconcile runs (left alone). ``shadowed``:
    which kinds only decide (``RECON_MODE``): their attempts so far are their shadow decisions'."""
    with engine.connect() as conn, conn.begin():
        conn.execute(sa.text("SET TRANSACTION READ ONLY"))
        scanned = [r for r in jobs_db.scan_stale(conn, limit) if kind is None or r.provider_kind == kind]
        money = reserved_logs(conn, [r.id for r in scanned])
        decided = shadow_attempts(conn, [r.id for r in scanned if shadowed and shadowed(r.provider_kind)])
        not_due = conn.execute(
            _NOT_DUE_SQL, {"due": [str(r.id) for r in scanned], "kind": kind, "limit": limit}
        ).all()
    plan = Plan()
    now = datetime.now(UTC)
    to_poll: list[JobRow] = []
    for row in scanned:
        takeover = row.reconcile_lease_owner is not None
        counter = row.reconcile_attempts + (1 if takeover else 0) + decided.get(row.id, 0)
        if row.id in busy:
            plan.jobs.append(_job(row, now, "-", PlanAction.LEAVE, "in a queued or running reconcile run"))
        elif takeover and decide_after_attempt(counter, settings.max_attempts) is Action.FORCE_FAIL:
            why = f"{counter} attempts: {row.reconcile_last_error or 'lease expired before the run finished'}"
            plan.jobs.append(_job(row, now, "-", PlanAction.FORCE_FAIL, why, money.get(row.id, [])))
        elif upstream is None and route(row) is Route.POLL and not row.nonfinite:
            plan.jobs.append(_job(row, now, "not asked", PlanAction.POLL, "--no-poll: upstream decides"))
        else:
            to_poll.append(row)
    rec = ReadOnlyReconciler(engine, upstream or _Unpolled(), settings)
    for p in rec.poll(to_poll):
        plan.jobs.append(
            polled_job(
                p,
                now,
                settings.max_attempts,
                money.get(p.row.id, []),
                shadow_counted=decided.get(p.row.id, 0),
            )
        )
    for r in not_due:
        age = float(r.age_s) if r.age_s is not None else None
        plan.jobs.append(
            PlannedJob(
                str(r.id), r.provider_kind, age, int(r.reconcile_attempts), "-", PlanAction.LEAVE, r.why
            )
        )
    return plan


def polled_job(
    p: Polled, now: datetime, max_attempts: int, logs: Sequence[ReservedLog], *, shadow_counted: int = 0
) -> PlannedJob:
    """What acting on a polled job does, as enforce's act phase would do it. ``shadow_counted``:
    the attempts shadow decided for this job so far (``shadow_attempts``), added to the counter
    enforce wrote, since a shadowed job's counter never moves."""
    row = p.row
    counter = row.reconcile_attempts + (1 if row.reconcile_lease_owner is not None else 0) + shadow_counted
    after = counter + 1
    step, outcome, reason = p.step, p.outcome, p.reason
    if step is Step.FINALIZE and p.status is not None:
        refused = refused_before_download(row, p.status)
        if refused is not None:  # finalize refuses it before any download: the attempt counts
            step, outcome, reason = (
                Step.COUNT,
                Outcome.ERROR,
                f"upstream succeeded, but finalize refuses it: {refused}",
            )
    action = action_for(step, outcome, after, max_attempts)
    if action is PlanAction.FORCE_FAIL:
        reason = f"{after} attempts: {reason}"
    elif action in (PlanAction.COUNT, PlanAction.LEAVE):
        reason = f"{reason}; counts attempt {after} of {max_attempts}"
    elif action is PlanAction.DEFER:
        reason = f"{p.not_sent}: {reason}; rescheduled, no attempt counted"
    return _job(row, now, upstream_answer(p.status, p.reason, p.step), action, reason, logs, attempt=after)


def _job(
    row: JobRow,
    now: datetime,
    upstream: str,
    action: PlanAction,
    reason: str,
    logs: Sequence[ReservedLog] = (),
    *,
    attempt: int | None = None,
) -> PlannedJob:
    since = row.provider_call_started_at or row.started_at or row.created_at
    age = (now - since).total_seconds() if since is not None else None
    if attempt is None:
        attempt = row.reconcile_attempts + (1 if row.reconcile_lease_owner is not None else 0) + 1
    return PlannedJob(
        str(row.id), row.provider_kind, age, attempt, upstream, action, reason, settlement(action, logs)
    )


# --- rendering -------------------------------------------------------------------------------------

_ORDER = [a.value for a in PlanAction]


def _num(d: Decimal) -> str:
    return format(d.normalize(), "f") if d else "0"


def _age(s: float | None) -> str:
    if s is None:
        return "?"
    if s < 3600:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


def table_rows(plan: Plan) -> list[list[str]]:
    head = ["job", "kind", "age", "attempt", "upstream", "action", "credits", "why"]
    body = [
        [
            j.job_id,
            j.kind or "(none)",
            _age(j.age_s),
            str(j.attempt),
            j.upstream,
            j.action.value,
            j.money.text(),
            j.reason[:90],
        ]
        for j in sorted(plan.jobs, key=lambda j: (_ORDER.index(j.action.value), j.kind or "", j.job_id))
    ]
    return [head, *body]


def totals_lines(plan: Plan) -> list[str]:
    m = plan.money()
    actions = plan.by_action()
    lines = [
        f"{len(plan.jobs)} job(s): " + ", ".join(f"{a}={actions[a]}" for a in _ORDER if actions[a]),
        f"credits: commit {_num(m.commit)}; refund {_num(m.refund)} "
        f"({_num(m.refund_sub)} to subscription, {_num(m.refund_topup)} to top-up)",
    ]
    for k, c in plan.by_kind().items():
        lines.append(f"  {k}: " + ", ".join(f"{a}={c[a]}" for a in _ORDER if c[a]))
    return lines


def to_text(plan: Plan) -> str:
    rows = table_rows(plan)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows]
    return "\n".join([*lines, "", *totals_lines(plan)])


def to_markdown(plan: Plan, limit: int = 200) -> str:
    rows = table_rows(plan)
    md = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    md += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows[1 : limit + 1]]
    if len(rows) - 1 > limit:
        md.append(f"\n({len(rows) - 1 - limit} more jobs: `recon-dagster plan --json`)")
    return "\n".join([*md, "", *(f"- {ln.strip()}" for ln in totals_lines(plan))])
