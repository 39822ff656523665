"""What reconciling a job produced, and its audit trail: the phases' hand-off (``Polled``), the
per-job ``JobOutcome``, the tick's ``Summary``, and ``EventLog``, which writes one
``reconcile_events`` row per outcome, many rows per statement.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from recon_dagster.core.redaction import redact_secrets
from recon_dagster.core.types import JobRow
from recon_dagster.db.sqltext import sql
from recon_dagster.providers.status import UpstreamStatus
from recon_dagster.reconcile.cause import Cause
from recon_dagster.reconcile.decide import Outcome

log = logging.getLogger("recon_dagster.reconcile")


@dataclass(frozen=True)
class JobOutcome:
    job_id: uuid.UUID
    provider_kind: str | None
    outcome: Outcome
    attempt: int
    detail: str
    duration_ms: int
    # Whose fault the end of the attempt was (``reconcile.cause``); None: not recorded, never
    # counted in provider health.
    cause: Cause | None = None


def make_outcome(
    job_id: uuid.UUID,
    kind: str | None,
    outcome: Outcome,
    attempt: int,
    detail: str,
    started: float,
    cause: Cause | None = None,
) -> JobOutcome:
    # Every outcome detail (reconcile_events, Dagster logs and metadata) passes here.
    detail = redact_secrets(detail)
    return JobOutcome(job_id, kind, outcome, attempt, detail, int((time.monotonic() - started) * 1000), cause)


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
    def exhausted(self) -> int:
        """Force-failed at the attempt cap (also part of ``failed``, the spec's tick line)."""
        return self.counts[Outcome.EXHAUSTED]

    @property
    def still_running(self) -> int:
        return self.counts[Outcome.STILL_RUNNING]

    @property
    def errors(self) -> int:
        return self.counts[Outcome.ERROR]

    @property
    def not_sent(self) -> int:
        """Polls this process never sent: rescheduled, no attempt counted."""
        return self.counts[Outcome.NOT_SENT]

    @property
    def our_faults(self) -> int:
        """Jobs a fault of ours stopped (configuration, storage, database): no attempt counted."""
        return self.counts[Outcome.OUR_FAULT]

    def line(self) -> str:
        extra = "".join(
            f" {k}={self.counts[k]}"
            for k in (Outcome.LOST_RACE, Outcome.SKIPPED, Outcome.NOT_SENT, Outcome.OUR_FAULT)
            if self.counts[k]
        )
        return (
            f"[reconcile] scanned={self.scanned} recovered={self.recovered} failed={self.failed} "
            f"stillRunning={self.still_running} errors={self.errors}{extra} ({self.elapsed_ms}ms)"
        )


class Step(StrEnum):
    """What the act phase does with a polled job (the run graph has one op per step)."""

    FINALIZE = "finalize"  # upstream succeeded: finalize_job_with_media
    FAIL = "fail"  # upstream failed / lost the task / result expired: fail + refund
    SWEEP = "sweep"  # sync kind, no task id, unknown kind: nothing to poll, fail + refund (5.6)
    COUNT = "count"  # still running, or this attempt errored: count the attempt
    DEFER = "defer"  # the poll was never sent: reschedule, no attempt counted


@dataclass(frozen=True)
class Polled:
    """The poll phase's hand-off: one claimed job, what upstream said, and the step it needs."""

    row: JobRow
    step: Step
    reason: str
    status: UpstreamStatus | None = None
    outcome: Outcome = Outcome.STILL_RUNNING  # for COUNT: still_running or error
    poll_ms: int = 0
    # DEFER: when the refusing limit expects to let a poll out again (None: unknown).
    retry_in_s: float | None = None
    # DEFER: the reason (a NotSentReason value).
    not_sent: str | None = None
    cause: Cause = Cause.ANSWERED  # whose fault a COUNT's error is; every other step was answered


def outcomes_since(conn: sa.Connection, since_epoch: float) -> Counter[str]:
    """Outcome counts recorded after ``since_epoch`` (the sensor's previous tick)."""
    rows = conn.execute(
        sql(
            "SELECT outcome, count(*) AS n FROM reconcile_events WHERE created_at > to_timestamp(:t) GROUP BY outcome"
        ),
        {"t": since_epoch},
    )
    return Counter({r.outcome: int(r.n) for r in rows})


# Rows carry their own age: a row written a moment after its outcome keeps the outcome's time
# (and the order of outcomes), as when each was written on its own.
_INSERT_EVENTS = sql(
    """
    INSERT INTO reconcile_events
      (job_id, provider_kind, attempt, outcome, detail, run_key, run_id, duration_ms, created_at, cause)
    SELECT e.job_id, e.kind, e.attempt, e.outcome, e.detail, :r, :run, e.ms,
           clock_timestamp() - make_interval(secs => e.age_s), e.cause
    FROM unnest(:ids, :kinds, :attempts, :outcomes, :details, :ms, :ages, :causes)
      AS e(job_id, kind, attempt, outcome, detail, ms, age_s, cause)
    ORDER BY e.age_s DESC
    """
).bindparams(
    sa.bindparam("ids", type_=pg.ARRAY(pg.UUID)),
    sa.bindparam("kinds", type_=pg.ARRAY(sa.Text)),
    sa.bindparam("attempts", type_=pg.ARRAY(sa.Integer)),
    sa.bindparam("outcomes", type_=pg.ARRAY(sa.Text)),
    sa.bindparam("details", type_=pg.ARRAY(sa.Text)),
    sa.bindparam("ms", type_=pg.ARRAY(sa.Integer)),
    sa.bindparam("ages", type_=pg.ARRAY(sa.Float)),
    sa.bindparam("causes", type_=pg.ARRAY(sa.Text)),
)


class EventLog:
    """The ``reconcile_events`` audit trail of one reconciler, written in groups.

    One row per outcome, as before, but one statement (and one transaction) per group instead of
    per job: a group goes out when it holds ``GROUP`` rows, when its oldest row is ``MAX_DELAY_S``
    old, and whenever the reconciler finishes a phase (``flush``). The trail never turns a
    reconciled job into a failed run: a group that cannot be written is retried row by row, and a
    row that still fails is logged and dropped, as a single insert's failure was. Thread-safe.
    """

    GROUP = 64
    MAX_DELAY_S = 2.0

    def __init__(self, engine: sa.Engine, run_id: str | None) -> None:
        self._engine = engine
        self._run_id = run_id
        self._lock = threading.Lock()
        self._pending: dict[str, list[tuple[JobOutcome, float]]] = {}
        self._count = 0
        self._oldest = 0.0

    def add(self, o: JobOutcome, owner: str) -> None:
        now = time.monotonic()
        with self._lock:
            if not self._count:
                self._oldest = now
            self._pending.setdefault(owner, []).append((o, now))
            self._count += 1
            if self._count < self.GROUP and now - self._oldest < self.MAX_DELAY_S:
                return
            pending = self._take()
        self._write(pending)

    def flush(self) -> None:
        with self._lock:
            pending = self._take()
        self._write(pending)

    def _take(self) -> dict[str, list[tuple[JobOutcome, float]]]:
        pending, self._pending, self._count = self._pending, {}, 0
        return pending

    def _write(self, pending: dict[str, list[tuple[JobOutcome, float]]]) -> None:
        for owner, rows in pending.items():
            try:
                self._insert(owner, rows)
            except Exception:  # find the row(s) it chokes on; the others are written
                for row in rows:
                    try:
                        self._insert(owner, [row])
                    except Exception:  # the audit trail must never fail a reconciled job's run
                        log.exception("could not record reconcile event for job %s", row[0].job_id)

    def _insert(self, owner: str, rows: list[tuple[JobOutcome, float]]) -> None:
        now = time.monotonic()
        with self._engine.begin() as conn:
            conn.execute(
                _INSERT_EVENTS,
                {
                    "ids": [str(o.job_id) for o, _ in rows],
                    "kinds": [o.provider_kind for o, _ in rows],
                    "attempts": [o.attempt for o, _ in rows],
                    "outcomes": [o.outcome.value for o, _ in rows],
                    "details": [o.detail[:2000] for o, _ in rows],
                    "ms": [o.duration_ms for o, _ in rows],
                    "ages": [max(0.0, now - at) for _, at in rows],
                    "causes": [o.cause.value if o.cause is not None else None for o, _ in rows],
                    "r": owner,
                    "run": self._run_id,
                },
            )
