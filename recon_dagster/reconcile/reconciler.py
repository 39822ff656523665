"""``reconcile(job) -> outcome``: the controller that drives one stale job toward a terminal state.

Level-triggered and safe to run twice: every step re-reads the row, every write is guarded, and
the reconcile lease (migration 136) keeps two runs from working the same job at once.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import sqlalchemy as sa
from opentelemetry.context import Context

from recon_dagster.core.crashpoints import crash_point
from recon_dagster.core.kinds import KINDS
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db import ledger
from recon_dagster.db.jobs import Claim, JobRow
from recon_dagster.media.errors import MediaError
from recon_dagster.media.store import MediaStore
from recon_dagster.providers.status import NotSent, UpstreamState, UpstreamStatus
from recon_dagster.reconcile import lora
from recon_dagster.reconcile.batches import claim_at_start, claim_isolated, renew_leases
from recon_dagster.reconcile.breaker import NotFoundBreaker
from recon_dagster.reconcile.cause import Cause, finalize_error_cause, our_fault, poll_error_cause
from recon_dagster.reconcile.decide import (
    Action,
    Outcome,
    Route,
    decide_after_attempt,
    failure_message,
    route,
)
from recon_dagster.reconcile.finalize import (
    ForeignTaskResult,
    MediaPolicy,
    ProviderResult,
    UnusableResult,
    fail_and_refund,
    finalize_job_with_media,
    force_fail_and_refund,
    sweep_no_recovery,
)
from recon_dagster.reconcile.observed import claimed_events, current_context, job_attributes, span
from recon_dagster.reconcile.orphans import listable_providers
from recon_dagster.reconcile.outcome import (
    EventLog,
    JobOutcome,
    Polled,
    Step,
    Summary,
    make_outcome,
    outcomes_since,
)
from recon_dagster.reconcile.poison import clamp_impossible_waits
from recon_dagster.reconcile.settle import ReconcileSettings, Settling, Upstream

# Passed on from reconcile.outcome and reconcile.settle: the runs import them here.
__all__ = [
    "EventLog",
    "JobOutcome",
    "Polled",
    "ReconcileSettings",
    "Step",
    "Summary",
    "Upstream",
    "make_outcome",
    "outcomes_since",
]

log = logging.getLogger("recon_dagster.reconcile")

_T = TypeVar("_T")
_R = TypeVar("_R")


class Reconciler(Settling):
    """Works leased jobs in two phases: ``poll`` asks upstream (no writes), ``act`` then does
    exactly one of finalize / fail+refund / sweep / count the attempt (force-fail+refund at the
    cap). ``claim`` takes the lease when a run starts; ``reconcile`` composes the phases per job."""

    def __init__(
        self,
        engine: sa.Engine,
        upstream: Upstream,
        store: MediaStore,
        *,
        settings: ReconcileSettings | None = None,
        media_policy: MediaPolicy | None = None,
        on_outcome: Callable[[JobOutcome], None] | None = None,
        run_id: str | None = None,
        breaker: NotFoundBreaker | None = None,
    ) -> None:
        self.engine = engine
        self.upstream = upstream
        self.store = store
        self.settings = settings or ReconcileSettings()
        # Poll answers are recorded per provider in the database: every run process shares them.
        self.breaker = breaker or NotFoundBreaker(engine)
        # An upstream without ``media_slot`` (a test's stand-in) holds nothing while media downloads.
        self.media_policy = media_policy or MediaPolicy(
            headers_for=upstream.media_headers, slot_for=getattr(upstream, "media_slot", None)
        )
        self.on_outcome = on_outcome
        self.run_id = run_id
        # Outcomes go to reconcile_events in groups; every phase below ends with ``flush``.
        self.events = EventLog(engine, run_id)
        self._sleep: Callable[[float], None] = time.sleep
        # When the current poll phase began (the in-run wait for the account is bounded by it).
        self._poll_phase_started = time.monotonic()

    # -- claim: the lease is taken when the run starts ------------------------------------------

    def claim(self, planned: Sequence[Claim], owner: str) -> tuple[list[JobRow], list[JobOutcome]]:
        """Lease the planned jobs to ``owner``; returns the rows to work and the outcomes already
        settled here: jobs not won (skipped) and takeovers that reached the cap (force-failed)."""
        started = time.monotonic()
        # One statement claims the whole batch: one span, with an event per job it won.
        with span("claim", {"recon.jobs": len(planned)}) as claiming, self.engine.begin() as conn:
            won, errors = claim_at_start(
                conn, planned, owner, self.settings.lease_ttl, cap=self.settings.max_attempts
            )
            rows = {r.id: r for r in jobs_db.load_jobs(conn, [c.job_id for c in won])}
            claimed_events(claiming, won)
        won_ids = {c.job_id for c in won}
        settled = [
            self._outcome(
                c.job_id,
                None,
                Outcome.ERROR if c.job_id in errors else Outcome.SKIPPED,
                c.attempt,
                errors.get(c.job_id)
                or "not claimed: another run holds it, an attempt was counted since, or it is no longer in flight",
                started,
                Cause.INTERNAL if c.job_id in errors else Cause.NOT_ASKED,
            )
            for c in planned
            if c.job_id not in won_ids
        ]
        work: list[JobRow] = []
        for c in won:
            row = rows.get(c.job_id)
            if row is None:
                continue
            if decide_after_attempt(row.reconcile_attempts, self.settings.max_attempts) is Action.FORCE_FAIL:
                # Taking over a dead run's lease counted its attempt, and that was the last one.
                why = row.reconcile_last_error or "lease expired before the run finished"
                try:
                    won_fail = force_fail_and_refund(
                        self.engine, row.id, attempts=row.reconcile_attempts, last_error=why,
                        kind=row.provider_kind,
                    )  # fmt: skip
                except Exception as exc:  # isolated: an anomaly, retried at the next takeover
                    self._settle_anomaly(row, "force_fail", exc, row.reconcile_attempts)
                    settled.append(
                        self._outcome(
                            row.id,
                            row.provider_kind,
                            Outcome.ERROR,
                            row.reconcile_attempts,
                            f"force_fail raised {type(exc).__name__}: {exc}",
                            started,
                            Cause.INTERNAL,
                        )  # fmt: skip
                    )
                    continue
                # Nothing was asked of the provider: its task, if still running, goes to the sweep.
                stopped = self.stop_upstream(row, None, Cause.INTERNAL) if won_fail else ""
                settled.append(
                    self._outcome(
                        row.id,
                        row.provider_kind,
                        Outcome.EXHAUSTED if won_fail else Outcome.LOST_RACE,
                        row.reconcile_attempts,
                        f"{row.reconcile_attempts} attempts: {why}{stopped}",
                        started,
                        Cause.INTERNAL,  # the run that made the last attempt died before recording it
                    )
                )
            else:
                work.append(row)
        for o in settled:
            self._record(o, owner)
        self.events.flush()
        return work, settled

    # -- poll: ask upstream, write nothing ------------------------------------------------------

    def poll(self, rows: Sequence[JobRow]) -> list[Polled]:
        """Poll every job concurrently (the provider resource enforces its own rate limits)."""
        self._poll_phase_started = time.monotonic()
        parent = current_context()  # the run's span, handed to the poll threads
        try:
            return self._map(lambda row: self._poll_guarded(row, parent), rows)
        finally:
            self.flush()

    def _poll_guarded(self, row: JobRow, parent: Context | None = None) -> Polled:
        started = time.monotonic()
        try:
            with span("poll", job_attributes(row), parent=parent):
                return self._poll_one(row)
        except Exception as exc:  # one bad job never takes the batch down
            log.exception("poll of job %s failed unexpectedly", row.id)
            return Polled(
                row,
                Step.COUNT,
                f"{type(exc).__name__}: {exc}",
                outcome=Outcome.ERROR,
                poll_ms=_ms(started),
                cause=Cause.INTERNAL,
            )

    def _poll_one(self, row: JobRow) -> Polled:
        started = time.monotonic()
        if decide_after_attempt(row.reconcile_attempts, self.settings.max_attempts) is Action.FORCE_FAIL:
            # A count at or past the cap (or negative) before this attempt: counting it (capped)
            # force-fails and refunds it, whatever its route.
            why = f"attempt counter {row.reconcile_attempts} is outside 0..{self.settings.max_attempts - 1}"
            return Polled(row, Step.COUNT, why, outcome=Outcome.ERROR, cause=Cause.INTERNAL)
        if row.nonfinite:
            self._flag_nonfinite(row)
            if route(row) is Route.SWEEP:
                # Its age is unknowable: no sweep on it. Counted attempts still end it (the cap
                # fails and refunds it with an anomaly), so it never sits in flight forever.
                why = f"non-finite {', '.join(row.nonfinite)}: not swept on an unknowable age"
                return Polled(row, Step.COUNT, why, outcome=Outcome.ERROR, cause=Cause.INTERNAL)
        if route(row) is Route.SWEEP:
            return Polled(row, Step.SWEEP, _sweep_reason(row), cause=Cause.NOT_ASKED)
        assert row.provider_kind is not None and row.provider_task_id is not None
        try:
            status = self._poll_when_let_out(row.provider_kind, row.provider_task_id)
        except NotSent as exc:  # never left this process: not an attempt
            return Polled(
                row,
                Step.DEFER,
                str(exc),
                outcome=Outcome.NOT_SENT,
                poll_ms=_ms(started),
                retry_in_s=exc.retry_in_s,
                not_sent=exc.reason.value,
            )
        except Exception as exc:
            fault = our_fault(exc)
            if fault is not None:  # a key missing or refused: ours to fix, not the job's attempt
                return Polled(
                    row, Step.DEFER, f"poll failed: {type(exc).__name__}: {exc}", outcome=Outcome.OUR_FAULT,
                    poll_ms=_ms(started), not_sent=fault.value, cause=Cause.INTERNAL,
                )  # fmt: skip
            self.breaker.record_error(row.provider_kind, exc)
            return Polled(
                row,
                Step.COUNT,
                f"poll failed: {type(exc).__name__}: {exc}",
                outcome=Outcome.ERROR,
                poll_ms=_ms(started),
                cause=poll_error_cause(exc),
            )
        crash_point("reconcile.after_poll")
        decision = self.breaker.judge(status)
        if decision.action is Action.FINALIZE:
            return Polled(row, Step.FINALIZE, decision.reason, status, poll_ms=_ms(started))
        if decision.action is Action.FAIL:
            return Polled(row, Step.FAIL, decision.reason, status, poll_ms=_ms(started))
        progress = f" ({status.progress}%)" if status.progress is not None else ""
        counted = Outcome.STILL_RUNNING if status.state is UpstreamState.RUNNING else Outcome.ERROR
        return Polled(
            row, Step.COUNT, f"{decision.reason}{progress}", status, outcome=counted, poll_ms=_ms(started)
        )

    def _poll_when_let_out(self, kind: str, task_id: str) -> UpstreamStatus:
        """One poll; one its account did not let out but will within the run's account wait (a
        Retry-After block, a token queue) is sent then. Anything else not sent is raised."""
        while True:
            try:
                return self.upstream.poll(kind, task_id)
            except NotSent as exc:
                wait = exc.retry_in_s
                left = self._poll_phase_started + self.settings.account_wait_s - time.monotonic()
                if wait is None or wait > left:
                    raise
                log.info(
                    "%s poll of task %s not sent (%s); sending it in %.1f s",
                    kind,
                    task_id,
                    exc.reason.value,
                    wait,
                )
                self._sleep(wait)

    # -- act: finalize, fail + refund, sweep, count the attempt, or reschedule --------------------

    def act(self, polled: Sequence[Polled], owner: str) -> list[JobOutcome]:
        """Act on polled jobs whose lease this run still holds (renewed in one statement first);
        a job whose lease was lost in between is skipped, never written."""
        started = time.monotonic()
        with self.engine.begin() as conn:
            ours = renew_leases(conn, [p.row.id for p in polled], owner, self.settings.lease_ttl)
            # Finalize's read for the whole batch in one statement, under the renewed lease.
            snapshots = jobs_db.load_jobs_and_reservations(
                conn, [p.row.id for p in polled if p.step is Step.FINALIZE and p.row.id in ours]
            )
        lost = [
            self._outcome(
                p.row.id,
                p.row.provider_kind,
                Outcome.SKIPPED,
                p.row.reconcile_attempts + 1,
                "lease lost between poll and act",
                started,
                Cause.NOT_ASKED,
            )
            for p in polled
            if p.row.id not in ours
        ]
        try:
            for o in lost:
                self._record(o, owner)
            parent = current_context()  # the run's span, handed to the settle threads
            return lost + self._map(
                lambda p: self._act_recorded(p, owner, snapshots.get(p.row.id), parent),
                [p for p in polled if p.row.id in ours],
            )
        finally:
            self.flush()

    def _act_recorded(
        self,
        p: Polled,
        owner: str,
        snapshot: jobs_db.RowAndReservation | None = None,
        parent: Context | None = None,
    ) -> JobOutcome:
        started = time.monotonic() - p.poll_ms / 1000
        try:
            with span("settle", {**job_attributes(p.row), "recon.step": p.step.value}, parent=parent):
                outcome = self._act_one(p, owner, started, snapshot)
        except Exception as exc:  # one bad job never takes the batch down
            log.exception("reconcile of job %s failed unexpectedly", p.row.id)
            outcome = self._attempt_failed(
                p.row, owner, f"{type(exc).__name__}: {exc}", Outcome.ERROR, started, Cause.INTERNAL
            )
        self._record(outcome, owner)
        return outcome

    def _act_one(
        self, p: Polled, owner: str, started: float, snapshot: jobs_db.RowAndReservation | None = None
    ) -> JobOutcome:
        row = p.row
        attempt = row.reconcile_attempts + 1
        if p.step is Step.SWEEP:
            try:
                won = sweep_no_recovery(self.engine, row.id, kind=row.provider_kind)
            except Exception as exc:
                return self._settle_failed(row, owner, "sweep", exc, started)
            return self._outcome(
                row.id,
                row.provider_kind,
                Outcome.SWEPT if won else Outcome.LOST_RACE,
                attempt,
                p.reason,
                started,
                Cause.NOT_ASKED,
            )
        if p.step is Step.FAIL:
            try:
                won = fail_and_refund(self.engine, row.id, failure_message(p.reason), kind=row.provider_kind)
            except Exception as exc:
                return self._settle_failed(row, owner, "fail_and_refund", exc, started)
            return self._outcome(
                row.id,
                row.provider_kind,
                Outcome.FAILED if won else Outcome.LOST_RACE,
                attempt,
                p.reason,
                started,
                Cause.ANSWERED,
            )
        if p.step is Step.COUNT:
            return self._attempt_failed(row, owner, p.reason, p.outcome, started, p.cause)
        if p.step is Step.DEFER:
            return self._reschedule(row, owner, p, started)
        assert p.status is not None
        try:
            result = finalize_job_with_media(
                self.engine,
                self.store,
                row.id,
                ProviderResult.from_status(p.status),
                source="reconcile",
                policy=self.media_policy,
                snapshot=snapshot,
            )
        except NotSent as exc:  # its media request never left this process: not an attempt
            deferred = Polled(row, Step.DEFER, str(exc), retry_in_s=exc.retry_in_s, not_sent=exc.reason.value)
            return self._reschedule(row, owner, deferred, started)
        except Exception as exc:
            fault = our_fault(exc)
            if fault is not None:  # our storage or database failed, not the job: no attempt counted
                ours = Polled(
                    row, Step.DEFER, finalize_failure(exc), outcome=Outcome.OUR_FAULT, not_sent=fault.value
                )
                return self._reschedule(row, owner, ours, started)
            # An expired signed URL or a refused host: never complete without the media.
            return self._attempt_failed(
                row, owner, finalize_failure(exc), Outcome.ERROR, started, finalize_error_cause(exc)
            )
        if result.ok:
            return self._outcome(
                row.id,
                row.provider_kind,
                Outcome.RECOVERED,
                attempt,
                f"completed; {len(result.stored)} media object(s) stored",
                started,
                Cause.ANSWERED,
            )
        return self._outcome(
            row.id, row.provider_kind, Outcome.LOST_RACE, attempt, result.reason, started, Cause.ANSWERED
        )

    # -- one job: the phases composed -----------------------------------------------------------

    def reconcile(self, job_id: uuid.UUID | str, owner: str) -> JobOutcome:
        """Poll and act on one job this run has leased (the worker path and tests use it); never
        raises (an error is an ERROR outcome, so a batch keeps every outcome)."""
        try:
            return self._reconcile_one(job_id, owner)
        finally:
            self.flush()

    def _reconcile_one(self, job_id: uuid.UUID | str, owner: str) -> JobOutcome:
        started = time.monotonic()
        job_id = uuid.UUID(str(job_id))
        try:
            outcome = self._reconcile_leased(job_id, owner, started)
        except Exception as exc:  # last resort: the database itself failed us for this job
            log.exception("reconcile of job %s failed and could not be counted", job_id)
            outcome = self._outcome(
                job_id, None, Outcome.ERROR, -1, f"{type(exc).__name__}: {exc}", started, Cause.INTERNAL
            )
        self._record(outcome, owner)
        return outcome

    def _reconcile_leased(self, job_id: uuid.UUID, owner: str, started: float) -> JobOutcome:
        with self.engine.begin() as conn:
            row = jobs_db.renew_lease(conn, job_id, owner, self.settings.lease_ttl)
        if row is None:
            outcome = self._outcome(
                job_id,
                None,
                Outcome.SKIPPED,
                -1,
                "not leased to this run or no longer in flight",
                started,
                Cause.NOT_ASKED,
            )
        else:
            try:
                outcome = self._reconcile_row(row, owner, started)
            except Exception as exc:  # one bad job never takes the batch down
                log.exception("reconcile of job %s failed unexpectedly", job_id)
                outcome = self._attempt_failed(
                    row, owner, f"{type(exc).__name__}: {exc}", Outcome.ERROR, started, Cause.INTERNAL
                )
        return outcome

    def _reconcile_row(self, row: JobRow, owner: str, started: float) -> JobOutcome:
        return self._act_one(self._poll_guarded(row), owner, started)

    # -- many jobs -----------------------------------------------------------------------------

    def reconcile_many(self, job_ids: Sequence[uuid.UUID | str], owner: str) -> list[JobOutcome]:
        """Work a batch concurrently; the provider resource enforces its own rate limits."""
        try:
            return self._map(lambda j: self._reconcile_one(j, owner), job_ids)
        finally:
            self.flush()

    def _map(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        if len(items) <= 1 or self.settings.concurrency <= 1:  # no thread for one job at a time
            return [fn(i) for i in items]
        with ThreadPoolExecutor(
            max_workers=min(self.settings.concurrency, len(items)), thread_name_prefix="reconcile"
        ) as pool:
            return list(pool.map(fn, items))

    def sweep_stale(self, owner: str, *, limit: int = 500) -> tuple[int, list[JobOutcome]]:
        """Phase 2 on its own: lease and sweep every stale row that cannot be recovered.

        Legacy LoRA trainings are adopted first (the scan leaves them alone until then): adopted,
        they carry their Replicate training id and are polled like any other job, never swept.

        Returns (rows scanned, outcomes)."""
        with self.engine.begin() as conn:
            for adopted in lora.adopt_legacy_trainings(conn):
                log.info(
                    "adopted legacy training %s of job %s before sweeping",
                    adopted.training_id,
                    adopted.job_id,
                )
        clamp_impossible_waits(self.engine, self.settings.lease_ttl, self.settings.cadence)
        with self.engine.begin() as conn:
            # Its own read (only rows it can sweep): no backlog of other kinds can fill its batch.
            rows = jobs_db.scan_sweepable(conn, limit)
            waiting = self.awaiting_orphan_look(conn, rows)
            claims = [
                jobs_db.Claim(r.id, r.reconcile_attempts)
                for r in rows
                if route(r) is Route.SWEEP and r.id not in waiting
            ]
            won, errors = claim_isolated(
                conn, claims, owner, self.settings.lease_ttl, planned=False, cap=self.settings.max_attempts
            )
        failed = [
            self._outcome(j, None, Outcome.ERROR, -1, e, time.monotonic(), Cause.INTERNAL)
            for j, e in errors.items()
        ]
        for o in failed:
            self._record(o, owner)
        return len(rows), failed + self.reconcile_many([c.job_id for c in won], owner)

    def awaiting_orphan_look(self, conn: sa.Connection, rows: Sequence[JobRow]) -> set[uuid.UUID]:
        """Rows whose last create got no answer at a provider that lists its tasks, not yet looked
        for by the orphan sweep: sweeping (failing, refunding) them now could refund a task that
        runs or succeeded upstream. A provider that cannot list is swept as before."""
        listable = self.settings.orphan_listable or listable_providers(self.upstream)
        if not rows or not listable:
            return set()
        return ledger.awaiting_look(conn, [r.id for r in rows], listable, self.settings.orphan_look_wait)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def finalize_failure(exc: BaseException) -> str:
    """Why a success could not be completed, in the words an operator reads first: what came back
    and what was promised (``UnusableResult``), or the media error with its URL last."""
    if isinstance(exc, ForeignTaskResult):
        return f"another task's result: {exc.problem}; not completed, nothing charged"
    if isinstance(exc, UnusableResult):
        return f"unusable result: {exc.problem}; not completed, nothing charged"
    if isinstance(exc, MediaError):
        return f"media not stored: {type(exc).__name__}: {exc.reason()}; not completed, nothing charged"
    return f"finalize failed: {type(exc).__name__}: {exc}"


def _sweep_reason(row: JobRow) -> str:
    kind = KINDS.get(row.provider_kind or "")
    if row.provider_kind is None:
        return "legacy row with no provider_kind: no recovery possible"
    if kind is None:
        return f"unknown provider_kind {row.provider_kind!r}: no recovery possible"
    if not kind.is_async:
        return f"{row.provider_kind} is synchronous: no recovery possible"
    return f"{row.provider_kind} row has no provider_task_id: no recovery possible"
