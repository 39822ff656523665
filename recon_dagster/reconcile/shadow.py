"""Shadow mode: the real sensor, runs and sweep, recording their decisions instead of acting.

``RECON_MODE`` (``enforce`` by default, or ``shadow``) sets every kind's mode; ``RECON_ENFORCE_KINDS``
and ``RECON_SHADOW_KINDS`` (comma lists of provider kinds) override it kind by kind, so a rollout
can enforce one kind at a time. Rows of no or an unknown kind follow ``RECON_MODE``.

A shadowed job is polled and judged exactly as enforce would (the same ``Reconciler.poll``), then
one ``reconcile_decisions`` row records the action and the credits it would move, and nothing
else is written: no lease, no attempt counter, no status, ledger, media, asset or workflow row,
no reconcile event. The cadence is kept from the decisions themselves: a job decided within
``RECON_RECONCILE_CADENCE_S`` is neither scanned as due nor decided again (the insert checks it
under a per-job lock, so two runs never record the same job twice in one cadence).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from recon_dagster.core.kinds import KINDS
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.jobs import Claim, JobRow
from recon_dagster.reconcile import lora
from recon_dagster.reconcile.batches import claim_isolated, next_attempt
from recon_dagster.reconcile.decide import Action, Outcome, Route, decide_after_attempt, route
from recon_dagster.reconcile.plan import (
    PlanAction,
    PlannedJob,
    polled_job,
    reserved_logs,
    settlement,
    shadow_attempts,
)
from recon_dagster.reconcile.poison import KindScope, clamp_impossible_waits, impossible_waits
from recon_dagster.reconcile.reconciler import JobOutcome, Polled, Reconciler

log = logging.getLogger("recon_dagster.reconcile.shadow")

SHADOW, ENFORCE = "shadow", "enforce"
# The training kind's legacy rows are adopted by the sweep (a jobs write): not while it is shadowed.
TRAINING_KIND = "replicate-training"


@dataclass(frozen=True)
class Modes:
    """Which provider kinds are enforced and which only shadowed."""

    default: str = ENFORCE
    enforce: frozenset[str] = frozenset()
    shadow: frozenset[str] = frozenset()

    def shadowed(self, kind: str | None) -> bool:
        if kind in self.shadow:
            return True
        if kind in self.enforce:
            return False
        return self.default == SHADOW

    @property
    def any_shadow(self) -> bool:
        return self.default == SHADOW or bool(self.shadow)

    def enforced_scope(self) -> KindScope:
        """The enforced kinds, as the rows a clamp may write (``reconcile.poison``)."""
        return KindScope(self.default == ENFORCE, self.enforce, self.shadow)


def _known_kinds(name: str, names: frozenset[str]) -> frozenset[str]:
    unknown = sorted(names - KINDS.keys())
    if unknown:
        raise ValueError(
            f"{name} names unknown provider kind(s) {', '.join(unknown)} (known: {', '.join(sorted(KINDS))})"
        )
    return names


def modes_from_values(
    default: str,
    enforce: frozenset[str],
    shadow: frozenset[str],
    *,
    names: tuple[str, str],
) -> Modes:
    """The modes of ``RECON_MODE`` / ``RECON_ENFORCE_KINDS`` / ``RECON_SHADOW_KINDS`` as read by the
    caller (``recon_dagster.config``); a kind unknown, or in both lists, is a ValueError naming the
    list, as ``names`` (enforce's, shadow's: the caller's variables) call them."""
    enforce_name, shadow_name = names
    enforce, shadow = _known_kinds(enforce_name, enforce), _known_kinds(shadow_name, shadow)
    both = sorted(enforce & shadow)
    if both:
        raise ValueError(f"{shadow_name} and {enforce_name} both name {', '.join(both)}")
    return Modes(default, enforce, shadow)


# --- the decisions table -----------------------------------------------------------------------------


# The reconciler's own decisions: the orphan sweep records its shadow decisions about a job's task
# in the same table (action ``orphan_*``), which must not hide the job from the sensor for a cadence.
_OWN = r"action NOT LIKE 'orphan\_%'"


def recently_decided(
    conn: sa.Connection, job_ids: Collection[uuid.UUID], cadence: timedelta
) -> set[uuid.UUID]:
    """The jobs among ``job_ids`` with a shadow decision of the reconciler within the cadence."""
    if not job_ids:
        return set()
    rows = conn.execute(
        sa.text(
            "SELECT DISTINCT job_id FROM reconcile_decisions WHERE job_id = ANY(:ids) "
            f"AND created_at > now() - make_interval(secs => :s) AND {_OWN}"
        ).bindparams(sa.bindparam("ids", type_=pg.ARRAY(pg.UUID))),
        {"ids": [str(j) for j in job_ids], "s": cadence.total_seconds()},
    ).scalars()
    return {uuid.UUID(str(j)) for j in rows}


def scan_due(
    conn: sa.Connection, limit: int, cadence: timedelta, *, modes: Modes, cap: int | None = None
) -> list[JobRow]:
    """The stale scan, minus shadowed jobs decided within the cadence. The scan is widened by the
    number of such decisions, so the jobs they hide never hide the rest (shadow writes no
    ``reconcile_next_at``). Without any shadowed kind this is ``scan_stale`` itself."""
    if not modes.any_shadow:
        return jobs_db.scan_stale(conn, limit)
    recent = conn.execute(
        sa.text(
            "SELECT count(DISTINCT job_id) FROM reconcile_decisions "
            f"WHERE created_at > now() - make_interval(secs => :s) AND {_OWN}"
        ),
        {"s": cadence.total_seconds()},
    ).scalar_one()
    wide = limit + int(recent)
    rows = jobs_db.scan_stale(conn, min(wide, cap) if cap else wide)
    hidden = recently_decided(conn, [r.id for r in rows if modes.shadowed(r.provider_kind)], cadence)
    return [r for r in rows if r.id not in hidden][:limit]


_RECORD = sa.text(
    f"""
    INSERT INTO reconcile_decisions (job_id, provider_kind, attempt, upstream, action, reason,
      commit_credits, refund_subscription, refund_topup, run_id, mode)
    SELECT :j, :k, :a, :up, :act, :why, :c, :rs, :rt, :run, 'shadow'
    WHERE NOT EXISTS (SELECT 1 FROM reconcile_decisions
                      WHERE job_id = :j AND created_at > now() - make_interval(secs => :s) AND {_OWN})
    RETURNING id
    """
)


def record_decision(engine: sa.Engine, job: PlannedJob, run_id: str | None, cadence: timedelta) -> bool:
    """Insert the decision unless the job has one within the cadence; True if recorded."""
    with engine.begin() as conn:
        # Serialises the check and the insert per job (a transaction-scoped lock: nothing stays).
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:j, 144))"), {"j": job.job_id})
        r = conn.execute(
            _RECORD,
            {
                "j": job.job_id,
                "k": job.kind,
                "a": job.attempt,
                "up": job.upstream,
                "act": job.action.value,
                "why": job.reason[:2000],
                "c": job.money.commit,
                "rs": job.money.refund_sub,
                "rt": job.money.refund_topup,
                "run": run_id,
                "s": cadence.total_seconds(),
            },
        ).first()
    return r is not None


# --- the reconciler, shadowing the kinds that are ---------------------------------------------------


class ShadowReconciler(Reconciler):
    """A ``Reconciler`` whose shadowed jobs are claimed without a lease and decided without acting;
    enforced jobs of the same run go through the parent unchanged."""

    def __init__(self, *args: Any, modes: Modes, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.modes = modes

    def _is_shadow(self, row: JobRow) -> bool:
        return self.modes.shadowed(row.provider_kind)

    def claim(self, planned: Sequence[Claim], owner: str) -> tuple[list[JobRow], list[JobOutcome]]:
        started = time.monotonic()
        with self.engine.connect() as conn:
            rows = {r.id: r for r in jobs_db.load_jobs(conn, [c.job_id for c in planned])}
            recent = recently_decided(conn, rows.keys(), self.settings.cadence)
            decided = shadow_attempts(conn, [r.id for r in rows.values() if self._is_shadow(r)])
        shadow = [c for c in planned if c.job_id in rows and self._is_shadow(rows[c.job_id])]
        shadow_ids = {c.job_id for c in shadow}
        enforce = [c for c in planned if c.job_id not in shadow_ids]
        work, settled = super().claim(enforce, owner) if enforce else ([], [])
        now = datetime.now(UTC)
        for c in shadow:
            row = rows[c.job_id]
            live = row.reconcile_lease_expires_at is not None and row.reconcile_lease_expires_at > now
            if not row.inflight or row.id in recent or live or (c.attempt and next_attempt(row) != c.attempt):
                why = "shadow: not decided (decided within the cadence, leased, moved on or no longer in flight)"
                settled.append(
                    self._shadow_outcome(row.id, row.provider_kind, next_attempt(row), why, started)
                )
                continue
            counter = (
                row.reconcile_attempts
                + (1 if row.reconcile_lease_owner is not None else 0)
                + decided.get(row.id, 0)
            )
            if (
                row.reconcile_lease_owner is not None
                and decide_after_attempt(counter, self.settings.max_attempts) is Action.FORCE_FAIL
            ):
                why = f"{counter} attempts: {row.reconcile_last_error or 'lease expired before the run finished'}"
                with self.engine.connect() as conn:
                    logs = reserved_logs(conn, [row.id]).get(row.id, [])
                money = settlement(PlanAction.FORCE_FAIL, logs)
                job = PlannedJob(
                    str(row.id), row.provider_kind, None, counter, "-", PlanAction.FORCE_FAIL, why, money
                )
                settled.append(self._decide(job, started))
            else:
                work.append(row)
        return work, settled

    def _flag_nonfinite(self, row: JobRow) -> None:
        if self._is_shadow(row):
            log.warning("job %s has non-finite %s (shadow: not flagged)", row.id, ", ".join(row.nonfinite))
            return
        super()._flag_nonfinite(row)

    def act(self, polled: Sequence[Polled], owner: str) -> list[JobOutcome]:
        shadow = [p for p in polled if self._is_shadow(p.row)]
        enforce = [p for p in polled if not self._is_shadow(p.row)]
        return (super().act(enforce, owner) if enforce else []) + self.decide(shadow)

    def decide(self, polled: Sequence[Polled]) -> list[JobOutcome]:
        """Record what acting on each polled job would do (one row per job per cadence)."""
        started = time.monotonic()
        now = datetime.now(UTC)
        with self.engine.connect() as conn:
            money = reserved_logs(conn, [p.row.id for p in polled])
            # Shadow writes no attempt counter: where a job stands is what its decisions say.
            decided = shadow_attempts(conn, [p.row.id for p in polled])
        out = []
        for p in polled:
            job = polled_job(
                p,
                now,
                self.settings.max_attempts,
                money.get(p.row.id, []),
                shadow_counted=decided.get(p.row.id, 0),
            )
            out.append(self._decide(job, started))
        return out

    def _decide(self, job: PlannedJob, started: float) -> JobOutcome:
        job_id = uuid.UUID(job.job_id)
        try:
            recorded = record_decision(self.engine, job, self.run_id, self.settings.cadence)
        except Exception as exc:  # one bad row never stops the rest
            log.exception("could not record the shadow decision of job %s", job_id)
            return self._shadow_outcome(
                job_id, job.kind, job.attempt, f"shadow: decision not recorded: {exc}", started
            )
        verb = "would" if recorded else "already decided within the cadence; would"
        return self._shadow_outcome(
            job_id, job.kind, job.attempt, f"shadow: {verb} {job.action.value} ({job.reason})", started
        )

    def _shadow_outcome(
        self, job_id: uuid.UUID, kind: str | None, attempt: int, detail: str, started: float
    ) -> JobOutcome:
        # Not a reconcile event: shadow leaves the audit trail (and its error rates) to enforce.
        o = self._outcome(job_id, kind, Outcome.SKIPPED, attempt, detail, started)
        if self.on_outcome is not None:
            self.on_outcome(o)
        return o

    def sweep_stale(self, owner: str, *, limit: int = 500) -> tuple[int, list[JobOutcome]]:
        if not self.modes.any_shadow:
            return super().sweep_stale(owner, limit=limit)
        if not self.modes.shadowed(TRAINING_KIND):
            with self.engine.begin() as conn:
                lora.adopt_legacy_trainings(conn)
        # Enforced kinds' impossible waits are clamped as in enforce (a mixed rollout must not hide
        # an enforced job forever); a shadowed kind's clamp is a decision, never a write.
        ttl, cadence = self.settings.lease_ttl, self.settings.cadence
        clamp_impossible_waits(self.engine, ttl, cadence, self.modes.enforced_scope())
        clamps = self._decide_clamps()
        # The sweep's own read, as in enforce (no backlog of other kinds can fill it).
        with self.engine.begin() as conn:
            rows = [r for r in jobs_db.scan_sweepable(conn, limit) if route(r) is Route.SWEEP]
            waiting = self.awaiting_orphan_look(conn, rows)
            rows = [r for r in rows if r.id not in waiting]
            recent = recently_decided(conn, [r.id for r in rows if self._is_shadow(r)], self.settings.cadence)
            claims = [Claim(r.id, r.reconcile_attempts) for r in rows if not self._is_shadow(r)]
            won, errors = claim_isolated(
                conn, claims, owner, self.settings.lease_ttl, planned=False, cap=self.settings.max_attempts
            )
        failed = [self._outcome(j, None, Outcome.ERROR, -1, e, time.monotonic()) for j, e in errors.items()]
        for o in failed:
            self._record(o, owner)
        enforced = self.reconcile_many([c.job_id for c in won], owner)
        shadowed = [r for r in rows if self._is_shadow(r) and r.id not in recent]
        return len(rows), failed + enforced + clamps + self.decide(self.poll(shadowed))

    def _decide_clamps(self) -> list[JobOutcome]:
        """A ``clamp`` decision (once per cadence) for each shadowed job whose lease or next
        attempt lies beyond what one of our writes sets: what enforce's sweep would clamp."""
        started = time.monotonic()
        ttl, cadence = self.settings.lease_ttl, self.settings.cadence
        with self.engine.connect() as conn:
            waits = impossible_waits(conn, ttl, cadence, self.modes.enforced_scope().inverse())
        out = []
        for w in waits:
            why = "; ".join(f"{reason} (was {was})" for reason, was in w.reasons)
            job = PlannedJob(
                str(w.job_id), w.provider_kind, None, w.attempts, "-", PlanAction.CLAMP,
                f"{why}: enforce clamps it to one lease TTL / cadence from now, with an anomaly",
            )  # fmt: skip
            out.append(self._decide(job, started))
        return out


def make_reconciler(*args: Any, modes: Modes, **kwargs: Any) -> Reconciler:
    """The reconciler the runs use: the plain one, or one that shadows the kinds ``modes`` says."""
    if modes.any_shadow:
        return ShadowReconciler(*args, modes=modes, **kwargs)
    return Reconciler(*args, **kwargs)
