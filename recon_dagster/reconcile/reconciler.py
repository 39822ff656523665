"""``reconcile(job) -> outcome``: the controller that drives one stale job toward a terminal state.

Level-triggered and safe to run twice: every step re-reads the row, every write is guarded, and
the reconcile lease (migration 136) keeps two runs from working the same job at once.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

import sqlalchemy as sa

from recon_dagster import lora
from recon_dagster.breaker import NotFoundBreaker
from recon_dagster.db import credits
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.jobs import JobRow
from recon_dagster.kinds import KINDS, MAX_ATTEMPTS, RECONCILE_CADENCE
from recon_dagster.media.store import MediaStore
from recon_dagster.providers.status import MediaRef, UpstreamState, UpstreamStatus
from recon_dagster.reconcile.decide import (
    Action,
    Outcome,
    Route,
    decide_after_attempt,
    failure_message,
    route,
)
from recon_dagster.reconcile.finalize import (
    MediaPolicy,
    ProviderResult,
    fail_and_refund,
    finalize_job_with_media,
    force_fail_and_refund,
    sweep_no_recovery,
)

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


@dataclass(frozen=True)
class JobOutcome:
    job_id: uuid.UUID
    provider_kind: str | None
    outcome: Outcome
    attempt: int
    detail: str
    duration_ms: int


@dataclass
class Summary:
    """The spec's per-tick log line, with real numbers (section 9)."""

    scanned: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    elapsed_ms: int = 0

    def add(self, outcomes: Iterable[JobOutcome]) -> Summary:
        for o in outcomes:
            self.counts[o.outcome.value] += 1
        return self

    def add_counts(self, counts: Mapping[str, int]) -> Summary:
        self.counts.update(counts)
        return self

    @property
    def recovered(self) -> int:
        return self.counts[Outcome.RECOVERED]

    @property
    def failed(self) -> int:
        return self.counts[Outcome.FAILED] + self.counts[Outcome.SWEPT] + self.counts[Outcome.EXHAUSTED]

    @property
    def still_running(self) -> int:
        return self.counts[Outcome.STILL_RUNNING]

    @property
    def errors(self) -> int:
        return self.counts[Outcome.ERROR]

    def line(self) -> str:
        extra = "".join(
            f" {k}={self.counts[k]}" for k in (Outcome.LOST_RACE, Outcome.SKIPPED) if self.counts[k]
        )
        return (
            f"[reconcile] scanned={self.scanned} recovered={self.recovered} failed={self.failed} "
            f"stillRunning={self.still_running} errors={self.errors}{extra} ({self.elapsed_ms}ms)"
        )


class Reconciler:
    """Works leased jobs: poll upstream, then exactly one of finalize / fail+refund / count the
    attempt (force-fail+refund at the cap); sync, task-less and unknown kinds are swept."""

    def __init__(
        self,
        engine: sa.Engine,
        upstream: Upstream,
        store: MediaStore,
        *,
        settings: ReconcileSettings | None = None,
        media_policy: MediaPolicy | None = None,
        on_outcome: Callable[[JobOutcome], None] | None = None,
        breaker: NotFoundBreaker | None = None,
    ) -> None:
        self.engine = engine
        self.upstream = upstream
        self.store = store
        self.settings = settings or ReconcileSettings()
        # Poll answers are recorded per provider in the database: every run process shares them.
        self.breaker = breaker or NotFoundBreaker(engine)
        self.media_policy = media_policy or MediaPolicy(headers_for=upstream.media_headers)
        self.on_outcome = on_outcome

    # -- one job -------------------------------------------------------------------------------

    def reconcile(self, job_id: uuid.UUID | str, owner: str) -> JobOutcome:
        started = time.monotonic()
        job_id = uuid.UUID(str(job_id))
        with self.engine.begin() as conn:
            row = jobs_db.renew_lease(conn, job_id, owner, self.settings.lease_ttl)
        if row is None:
            outcome = self._outcome(
                job_id, None, Outcome.SKIPPED, -1, "not leased to this run or no longer in flight", started
            )
        else:
            try:
                outcome = self._reconcile_row(row, owner, started)
            except Exception as exc:  # one bad job never takes the batch down
                log.exception("reconcile of job %s failed unexpectedly", job_id)
                outcome = self._attempt_failed(
                    row, owner, f"{type(exc).__name__}: {exc}", Outcome.ERROR, started
                )
        self._record(outcome, owner)
        return outcome

    def _reconcile_row(self, row: JobRow, owner: str, started: float) -> JobOutcome:
        if row.nonfinite:
            self._flag_nonfinite(row)
            if route(row) is Route.SWEEP:
                # Its age is unknowable: no sweep on it. Counted attempts still end it (the cap
                # fails and refunds it with an anomaly), so it never sits in flight forever.
                why = f"non-finite {', '.join(row.nonfinite)}: not swept on an unknowable age"
                return self._attempt_failed(row, owner, why, Outcome.ERROR, started)
        if route(row) is Route.SWEEP:
            won = sweep_no_recovery(self.engine, row.id)
            why = _sweep_reason(row)
            return self._outcome(
                row.id,
                row.provider_kind,
                Outcome.SWEPT if won else Outcome.LOST_RACE,
                row.reconcile_attempts,
                why,
                started,
            )

        assert row.provider_kind is not None and row.provider_task_id is not None
        try:
            status = self.upstream.poll(row.provider_kind, row.provider_task_id)
        except Exception as exc:
            self.breaker.record_error(row.provider_kind, exc)
            return self._attempt_failed(
                row, owner, f"poll failed: {type(exc).__name__}: {exc}", Outcome.ERROR, started
            )

        decision = self.breaker.judge(status)
        if decision.action is Action.FINALIZE:
            try:
                result = finalize_job_with_media(
                    self.engine,
                    self.store,
                    row.id,
                    ProviderResult.from_status(status),
                    source="reconcile",
                    policy=self.media_policy,
                )
            except Exception as exc:
                # An expired signed URL or a refused host: never complete without the media.
                return self._attempt_failed(
                    row, owner, f"finalize failed: {type(exc).__name__}: {exc}", Outcome.ERROR, started
                )
            if result.ok:
                return self._outcome(
                    row.id,
                    row.provider_kind,
                    Outcome.RECOVERED,
                    row.reconcile_attempts,
                    f"completed; {len(result.stored)} media object(s) stored",
                    started,
                )
            return self._outcome(
                row.id, row.provider_kind, Outcome.LOST_RACE, row.reconcile_attempts, result.reason, started
            )

        if decision.action is Action.FAIL:
            won = fail_and_refund(self.engine, row.id, failure_message(decision.reason))
            return self._outcome(
                row.id,
                row.provider_kind,
                Outcome.FAILED if won else Outcome.LOST_RACE,
                row.reconcile_attempts,
                decision.reason,
                started,
            )

        progress = f" ({status.progress}%)" if status.progress is not None else ""
        kind = Outcome.STILL_RUNNING if status.state is UpstreamState.RUNNING else Outcome.ERROR
        return self._attempt_failed(row, owner, f"{decision.reason}{progress}", kind, started)

    def _attempt_failed(self, row: JobRow, owner: str, why: str, kind: Outcome, started: float) -> JobOutcome:
        with self.engine.begin() as conn:
            attempts = jobs_db.bump_attempts(
                conn,
                row.id,
                expected_attempts=row.reconcile_attempts,
                last_error=why[:2000],
                next_in=self.settings.cadence,
                owner=owner,
            )
        if attempts is None:
            return self._outcome(
                row.id,
                row.provider_kind,
                Outcome.LOST_RACE,
                row.reconcile_attempts,
                f"row moved on while attempt was counted ({why})",
                started,
            )
        if decide_after_attempt(attempts, self.settings.max_attempts) is Action.FORCE_FAIL:
            won = force_fail_and_refund(self.engine, row.id, attempts=attempts, last_error=why)
            return self._outcome(
                row.id,
                row.provider_kind,
                Outcome.EXHAUSTED if won else Outcome.LOST_RACE,
                attempts,
                f"{attempts} attempts: {why}",
                started,
            )
        return self._outcome(row.id, row.provider_kind, kind, attempts, why, started)

    def _flag_nonfinite(self, row: JobRow) -> None:
        """A timestamp at +/-infinity: logged with the job id and kept as a credit anomaly (once)."""
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

    # -- many jobs -----------------------------------------------------------------------------

    def reconcile_many(self, job_ids: Sequence[uuid.UUID | str], owner: str) -> list[JobOutcome]:
        """Work a batch concurrently; the provider resource enforces its own rate limits."""
        if len(job_ids) <= 1:
            return [self.reconcile(j, owner) for j in job_ids]
        with ThreadPoolExecutor(
            max_workers=min(self.settings.concurrency, len(job_ids)), thread_name_prefix="reconcile"
        ) as pool:
            return list(pool.map(lambda j: self.reconcile(j, owner), job_ids))

    def sweep_stale(self, owner: str, *, limit: int = 500) -> tuple[int, list[JobOutcome]]:
        """Phase 2 on its own: lease and sweep every stale row that cannot be recovered.

        Legacy LoRA trainings are adopted first (the scan leaves them alone until then): adopted,
        they carry their Replicate training id and are polled like any other job, never swept.

        Returns (rows scanned, outcomes)."""
        with self.engine.begin() as conn:
            for adopted in lora.adopt_legacy_trainings(conn):
                log.info("adopted legacy training %s of job %s before sweeping", adopted.training_id, adopted.job_id)
        with self.engine.begin() as conn:
            rows = jobs_db.scan_stale(conn, limit)
            claims = [jobs_db.Claim(r.id, r.reconcile_attempts) for r in rows if route(r) is Route.SWEEP]
            won = jobs_db.claim_jobs(conn, claims, owner, self.settings.lease_ttl)
        return len(rows), self.reconcile_many([c.job_id for c in won], owner)

    # -- bookkeeping -----------------------------------------------------------------------------

    def _outcome(
        self, job_id: uuid.UUID, kind: str | None, outcome: Outcome, attempt: int, detail: str, started: float
    ) -> JobOutcome:
        return JobOutcome(job_id, kind, outcome, attempt, detail, int((time.monotonic() - started) * 1000))

    def _record(self, o: JobOutcome, owner: str) -> None:
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.text(
                        """
                        INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome, detail, run_key, duration_ms)
                        VALUES (:j, :k, :a, :o, :d, :r, :ms)
                        """
                    ),
                    {
                        "j": str(o.job_id),
                        "k": o.provider_kind,
                        "a": o.attempt,
                        "o": o.outcome.value,
                        "d": o.detail[:2000],
                        "r": owner,
                        "ms": o.duration_ms,
                    },
                )
        except Exception:  # the audit trail must never turn a reconciled job into a failed run
            log.exception("could not record reconcile event for job %s", o.job_id)
        if self.on_outcome is not None:
            self.on_outcome(o)


def outcomes_since(conn: sa.Connection, since_epoch: float) -> Counter[str]:
    """Outcome counts recorded after ``since_epoch`` (the sensor's previous tick)."""
    rows = conn.execute(
        sa.text(
            "SELECT outcome, count(*) AS n FROM reconcile_events WHERE created_at > to_timestamp(:t) GROUP BY outcome"
        ),
        {"t": since_epoch},
    )
    return Counter({r.outcome: int(r.n) for r in rows})


def _sweep_reason(row: JobRow) -> str:
    kind = KINDS.get(row.provider_kind or "")
    if row.provider_kind is None:
        return "legacy row with no provider_kind: no recovery possible"
    if kind is None:
        return f"unknown provider_kind {row.provider_kind!r}: no recovery possible"
    if not kind.is_async:
        return f"{row.provider_kind} is synchronous: no recovery possible"
    return f"{row.provider_kind} row has no provider_task_id: no recovery possible"
