"""Settling an attempt that did not end the job, and the reconciler's bookkeeping.

``Reconciler`` (``reconciler.py``) drives a job through claim, poll and act; what it does when an
attempt ends without a terminal state lives here, in its base class ``Settling``: count the
attempt (force-fail and refund at the cap), reschedule a poll that was never sent, record a
settle step that raised or a timestamp Python cannot hold, and make and record every outcome.
``ReconcileSettings`` and ``Upstream``, what a reconciler is built with, are declared here too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import sqlalchemy as sa

from recon_dagster.core.kinds import MAX_ATTEMPTS, RECONCILE_CADENCE
from recon_dagster.core.redaction import redact_secrets
from recon_dagster.db import credits
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.jobs import JobRow
from recon_dagster.providers.status import MediaRef, UpstreamStatus
from recon_dagster.reconcile.breaker import NotFoundBreaker
from recon_dagster.reconcile.cause import Cause, our_fault
from recon_dagster.reconcile.decide import Action, Outcome, decide_after_attempt, not_sent_detail
from recon_dagster.reconcile.finalize import force_fail_and_refund
from recon_dagster.reconcile.observed import count_outcome
from recon_dagster.reconcile.outcome import EventLog, JobOutcome, Polled, Step, make_outcome
from recon_dagster.reconcile.stop_upstream import stop_task

log = logging.getLogger("recon_dagster.reconcile")


class Upstream(Protocol):
    """What reconciliation needs from the provider layer (``ProvidersResource`` satisfies it)."""

    def poll(self, kind: str, task_id: str) -> UpstreamStatus: ...

    def media_headers(self, kind: str, ref: MediaRef) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class ReconcileSettings:
    max_attempts: int = MAX_ATTEMPTS
    # Attempts are spaced at the cadence so MAX_ATTEMPTS keeps meaning ~90 minutes (spec 5.5).
    cadence: timedelta = RECONCILE_CADENCE
    lease_ttl: timedelta = timedelta(minutes=15)
    concurrency: int = 16
    # A poll its account's limiter did not let out, with a time it will (a Retry-After block, a
    # token queue), is tried again within the run while the run's poll phase is younger than
    # this (None: a third of the lease), so the account's budget is used again the moment the
    # block ends instead of a sensor tick and a run start later. Past it the job is rescheduled.
    account_wait: timedelta | None = None
    # A poll that was not sent is due again after the refusing limit's hint, or this when it gave
    # none (a slot wait, an unreachable limiter); never later than the cadence.
    not_sent_delay: timedelta = timedelta(seconds=60)
    # A job whose create's answer was lost, at a provider that lists its tasks, is swept only once
    # the orphan sweep has looked for that task, or this long after the create.
    orphan_look_wait: timedelta = timedelta(hours=6)
    # The providers whose tasks can be listed, when the reconciler's upstream is not the providers
    # resource itself (the sweep, which never polls); empty: asked of the upstream.
    orphan_listable: frozenset[str] = frozenset()

    @property
    def account_wait_s(self) -> float:
        wait = self.account_wait if self.account_wait is not None else self.lease_ttl / 3
        return wait.total_seconds()


class Settling:
    """The half of ``Reconciler`` that settles an attempt and records outcomes; ``Reconciler``'s
    ``__init__`` sets the attributes below."""

    engine: sa.Engine
    settings: ReconcileSettings
    breaker: NotFoundBreaker
    events: EventLog
    on_outcome: Callable[[JobOutcome], None] | None

    def _attempt_failed(
        self, row: JobRow, owner: str, why: str, kind: Outcome, started: float, cause: Cause
    ) -> JobOutcome:
        """Count the attempt (an error or still running, whose fault ``cause`` says); the one that
        reaches the cap force-fails and refunds, keeping the cause of that last attempt."""
        why = redact_secrets(why)  # before it is cut to length, so no half key survives
        with self.engine.begin() as conn:
            attempts = jobs_db.bump_attempts(
                conn,
                row.id,
                expected_attempts=row.reconcile_attempts,
                last_error=why[:2000],
                next_in=self.settings.cadence,
                owner=owner,
                cap=self.settings.max_attempts,
            )
        if attempts is None:
            return self._outcome(
                row.id,
                row.provider_kind,
                Outcome.LOST_RACE,
                row.reconcile_attempts + 1,
                f"row moved on while attempt was counted ({why})",
                started,
                cause,
            )
        if decide_after_attempt(attempts, self.settings.max_attempts) is Action.FORCE_FAIL:
            try:
                won = force_fail_and_refund(
                    self.engine, row.id, attempts=attempts, last_error=why, kind=row.provider_kind
                )
            except Exception as exc:
                # Left in flight at the cap (bump_attempts never climbs past it): retried next cadence.
                self._settle_anomaly(row, "force_fail", exc, attempts)
                return self._outcome(
                    row.id, row.provider_kind, Outcome.ERROR, attempts,
                    f"{attempts} attempts: force_fail raised {type(exc).__name__}: {exc} ({why})", started,
                    Cause.INTERNAL,
                )  # fmt: skip
            stopped = self.stop_upstream(row, kind, cause) if won else ""
            return self._outcome(
                row.id,
                row.provider_kind,
                Outcome.EXHAUSTED if won else Outcome.LOST_RACE,
                attempts,
                f"{attempts} attempts: {why}{stopped}",
                started,
                cause,
            )
        return self._outcome(row.id, row.provider_kind, kind, attempts, why, started, cause)

    def stop_upstream(self, row: JobRow, kind: Outcome | None, cause: Cause | None) -> str:
        """A job force-failed at the cap: its task is cancelled now when the provider has just
        answered that it runs; handed to the orphan sweep when the provider did not answer (an
        outage: a cancel would only time out) or the attempt says nothing of it; left alone when
        the job's own result ended it. Returns "; what became of it" for the outcome's detail."""
        if cause is Cause.JOB:
            return ""
        answered_running = kind is Outcome.STILL_RUNNING and cause is Cause.ANSWERED
        provider = str(row.provider_kind or "its provider")
        why_not = (
            f"{provider} did not answer its last poll" if cause is Cause.PROVIDER
            else "its last attempt did not reach the provider"
        )  # fmt: skip
        stopped = stop_task(
            self.engine, getattr(self, "upstream", None), row, cancel_now=answered_running, why_not=why_not
        )
        return f"; {stopped.line}" if stopped is not None else ""

    def _reschedule(self, row: JobRow, owner: str, p: Polled, started: float) -> JobOutcome:
        """A poll that was never sent: the lease released and the job due again when its account
        will let a poll out (at most one cadence away); the attempt counter untouched. A fault of
        ours (``Outcome.OUR_FAULT``) is released the same way, due again after a cadence."""
        ours = p.outcome is Outcome.OUR_FAULT
        delay = self.settings.cadence if ours else self.not_sent_delay(p.retry_in_s)
        with self.engine.begin() as conn:
            won = jobs_db.reschedule_not_sent(
                conn, row.id, expected_attempts=row.reconcile_attempts, owner=owner, next_in=delay
            )
        attempt = row.reconcile_attempts + 1
        if not won:
            return self._outcome(
                row.id, row.provider_kind, Outcome.LOST_RACE, attempt,
                f"row moved on while the unsent poll was rescheduled ({p.reason})", started,
            )  # fmt: skip
        detail = not_sent_detail(p.not_sent or "not_sent", p.reason, delay.total_seconds())
        if ours:
            log.error("job %s: %s", row.id, redact_secrets(detail))
            return self._outcome(
                row.id, row.provider_kind, Outcome.OUR_FAULT, attempt, detail, started, Cause.INTERNAL
            )
        return self._outcome(
            row.id, row.provider_kind, Outcome.NOT_SENT, attempt, detail, started, Cause.NOT_ASKED
        )

    def not_sent_delay(self, retry_in_s: float | None) -> timedelta:
        """When a job whose poll was not sent is due again: the limit's hint (at least a second),
        else ``not_sent_delay``; never past the cadence."""
        hint = self.settings.not_sent_delay if retry_in_s is None else timedelta(seconds=max(1.0, retry_in_s))
        return min(hint, self.settings.cadence)

    def _flag_nonfinite(self, row: JobRow) -> None:
        """A timestamp Python cannot hold (BC, after 9999, +/-infinity): logged with the job id and
        kept as a credit anomaly (once)."""
        log.warning("job %s has non-finite %s", row.id, ", ".join(row.nonfinite))
        try:
            with self.engine.begin() as conn:
                credits.log_credit_anomaly(
                    conn,
                    job_id=row.id,
                    user_id=row.user_id,
                    reason="nonfinite_timestamp",
                    details={"columns": list(row.nonfinite), "provider_kind": row.provider_kind},
                )
        except Exception:  # the flag is bookkeeping; the attempt goes on without it
            log.exception("could not record the non-finite timestamp anomaly of job %s", row.id)

    def _settle_failed(
        self, row: JobRow, owner: str, step: str, exc: Exception, started: float
    ) -> JobOutcome:
        """A fail/refund/sweep that raised: an anomaly, and the attempt counted (capped); our
        database failing us (a blip) counts nothing and is retried after a cadence."""
        fault = our_fault(exc)
        if fault is not None:
            why = f"settle step {step} raised {type(exc).__name__}: {exc}"
            ours = Polled(row, Step.DEFER, why, outcome=Outcome.OUR_FAULT, not_sent=fault.value)
            return self._reschedule(row, owner, ours, started)
        self._settle_anomaly(row, step, exc, row.reconcile_attempts + 1)
        return self._attempt_failed(
            row,
            owner,
            f"settle step {step} raised {type(exc).__name__}: {exc}",
            Outcome.ERROR,
            started,
            Cause.INTERNAL,
        )

    def _settle_anomaly(self, row: JobRow, step: str, exc: Exception, attempts: int) -> None:
        """One ``reconcile_settle_error`` anomaly per job, so the stuck reservation is seen."""
        log.error("job %s: settle step %s raised", row.id, step, exc_info=exc)
        try:
            with self.engine.begin() as conn:
                credits.log_credit_anomaly(
                    conn,
                    job_id=row.id,
                    user_id=row.user_id,
                    reason="reconcile_settle_error",
                    details={
                        "step": step,
                        "error": redact_secrets(f"{type(exc).__name__}: {exc}")[:2000],
                        "attempts": attempts,
                        "provider_kind": row.provider_kind,
                        "provider_task_id": row.provider_task_id,
                    },
                )
        except Exception:
            log.exception("could not record the settle anomaly of job %s", row.id)

    # -- bookkeeping -----------------------------------------------------------------------------

    # Every outcome of this reconciler (and of its shadow subclass) is made here.
    _outcome = staticmethod(make_outcome)

    def _record(self, o: JobOutcome, owner: str) -> None:
        self.events.add(o, owner)
        count_outcome(o)
        if self.on_outcome is not None:
            self.on_outcome(o)

    def flush(self) -> None:
        """Write what the phase left buffered: poll answers and reconcile_events rows."""
        try:
            self.breaker.flush()
        finally:
            self.events.flush()
