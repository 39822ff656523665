"""Retention of recon_dagster's own tables: what is deleted, in what batches, and what never is.

The ``prune_history`` job (``defs/retention``) calls ``prune_pass`` once an hour. Every statement
deletes at most ``batch`` rows found through an index on their age, in its own short transaction
under the migrations' ``lock_timeout`` (2 s): it takes row locks on our own rows only (``FOR
UPDATE SKIP LOCKED``: a row someone else holds is left for the next pass) and reads the app's
``jobs`` and ``usage_logs`` without locking them, so an app write never waits for a pass longer
than a lock timeout, and a pass never waits for an app write.

Never deleted, whatever the age (``KEEP`` says why, and docs/operations.md repeats it):

- any row of a job still in flight (``pending``/``processing``) or with credits still reserved
  (an open ``usage_logs`` reservation): its reconcile history decides its attempts and its refund;
- any row younger than the oldest open alert incident (the caller lowers the cutoffs to it);
- a create the orphan sweep has not judged (``sending``/``ambiguous`` with no fate: maybe billed),
  a billed orphan (``orphan_billed``: money to claim back), a create inside the sweep's window or of
  a spend day not yet final (the spend checks read the ledger's task ids);
- a balance sample (``recon_balance_samples``) at the head of its provider's chain (the next spend
  run measures from it), one taken on or after the start of the oldest spend day not final yet,
  or the sample such a one measures from; older samples go oldest first, and the oldest one kept
  becomes the chain's first (its ``previous_id`` cleared in the same statement);
- the app's tables (``jobs``, ``usage_logs``, ``user_credits``, ``credit_anomalies``, ``assets``):
  never written here; ``recon_credit_anomaly_keys`` (one row per credit anomaly, its dedup key);
  ``recon_schema_migrations`` and ``recon_schema_contract``.

What a pruned job's rows said is added, in the same transaction, to its one ``recon_pruned_jobs``
row, which ``explain`` shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from recon_dagster.db.sqltext import sql

LOCK_TIMEOUT = "2s"  # the migrations' lock timeout (db/migrate.py): no app write waits longer
STATEMENT_TIMEOUT = "30s"
TOMBSTONES = "recon_pruned_jobs"

# A job whose rows may go: not in flight, no credits reserved (a job the app deleted has neither).
_JOB_SETTLED = """
  NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = {t}.job_id AND j.status IN ('pending', 'processing'))
  AND NOT EXISTS (SELECT 1 FROM usage_logs u WHERE u.job_id = {t}.job_id AND u.status = 'reserved')
"""


@dataclass(frozen=True)
class Cutoffs:
    """Rows older than these may go (each already lowered by every guard that applies)."""

    events: datetime
    decisions: datetime
    creates: datetime
    tombstones: datetime
    poll_answers: datetime
    balance_samples: datetime | None = None  # None: the KIE balance chain is left alone


@dataclass(frozen=True)
class Horizons:
    """How long each table is kept, and the windows that must never lose a row (seconds)."""

    events_s: float
    decisions_s: float
    creates_s: float
    tombstones_s: float
    poll_answers_s: float  # the not-found breaker's window
    orphan_window_s: float  # the orphan sweep's look-back (its ambiguous-create wait included)
    spend_final_after_s: float  # a spend day is final this long after it ends
    balance_samples_s: float = 90 * 86_400.0


def cutoffs(now: datetime, h: Horizons, open_incident_since: datetime | None = None) -> Cutoffs:
    """The cutoffs at ``now``: each table's retention, lowered to the start of the oldest open
    incident (its evidence stays until it resolves); the ledger's also to the orphan sweep's window
    and to the start of the oldest spend day not final yet."""

    def cap(at: datetime) -> datetime:
        return min(at, open_incident_since) if open_incident_since is not None else at

    day = timedelta(days=1)
    # A day [d, d+1) is final once now >= d + 1 day + final_after: the oldest day not final starts
    # at the day boundary at or before now - 1 day - final_after.
    not_final = (now - day - timedelta(seconds=h.spend_final_after_s)).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    creates = min(now - timedelta(seconds=h.creates_s), now - timedelta(seconds=h.orphan_window_s), not_final)
    return Cutoffs(
        events=cap(now - timedelta(seconds=h.events_s)),
        decisions=cap(now - timedelta(seconds=h.decisions_s)),
        creates=cap(creates),
        tombstones=now - timedelta(seconds=h.tombstones_s),
        poll_answers=now - timedelta(seconds=h.poll_answers_s),
        balance_samples=cap(min(now - timedelta(seconds=h.balance_samples_s), not_final)),
    )


# --- one batch per table --------------------------------------------------------------------------

_EVENTS = f"""
WITH victims AS (
  SELECT e.id FROM reconcile_events e
  WHERE e.created_at < :cut AND {_JOB_SETTLED.format(t="e")}
  ORDER BY e.created_at LIMIT :n FOR UPDATE OF e SKIP LOCKED
), gone AS (
  DELETE FROM reconcile_events e USING victims v WHERE e.id = v.id
  RETURNING e.job_id, e.created_at, e.attempt, e.outcome, e.run_id
), per_job AS (
  SELECT job_id, count(*) AS n, min(created_at) AS first_at, max(created_at) AS last_at,
         (array_agg(attempt ORDER BY created_at DESC))[1] AS last_attempt,
         (array_agg(outcome ORDER BY created_at DESC))[1] AS last_outcome,
         (array_agg(run_id ORDER BY created_at DESC))[1] AS last_run_id
  FROM gone GROUP BY job_id
), kept AS (
  INSERT INTO {TOMBSTONES} AS t (job_id, events, first_at, last_at, last_attempt, last_outcome, last_run_id)
  SELECT job_id, n, first_at, last_at, last_attempt, last_outcome, last_run_id FROM per_job
  ON CONFLICT (job_id) DO UPDATE SET
    events = t.events + EXCLUDED.events,
    first_at = LEAST(t.first_at, EXCLUDED.first_at),
    last_attempt = CASE WHEN t.last_at IS NULL OR EXCLUDED.last_at >= t.last_at
                        THEN EXCLUDED.last_attempt ELSE t.last_attempt END,
    last_outcome = CASE WHEN t.last_at IS NULL OR EXCLUDED.last_at >= t.last_at
                        THEN EXCLUDED.last_outcome ELSE t.last_outcome END,
    last_run_id = CASE WHEN t.last_at IS NULL OR EXCLUDED.last_at >= t.last_at
                       THEN EXCLUDED.last_run_id ELSE t.last_run_id END,
    last_at = GREATEST(t.last_at, EXCLUDED.last_at),
    pruned_at = now()
  RETURNING 1
)
SELECT count(*) FROM gone
"""

_DECISIONS = f"""
WITH victims AS (
  SELECT d.id FROM reconcile_decisions d
  WHERE d.created_at < :cut AND {_JOB_SETTLED.format(t="d")}
  ORDER BY d.created_at LIMIT :n FOR UPDATE OF d SKIP LOCKED
), gone AS (
  DELETE FROM reconcile_decisions d USING victims v WHERE d.id = v.id RETURNING d.job_id, d.created_at
), kept AS (
  INSERT INTO {TOMBSTONES} AS t (job_id, decisions, first_at, last_at)
  SELECT job_id, count(*), min(created_at), max(created_at) FROM gone GROUP BY job_id
  ON CONFLICT (job_id) DO UPDATE SET
    decisions = t.decisions + EXCLUDED.decisions,
    first_at = LEAST(t.first_at, EXCLUDED.first_at),
    last_at = GREATEST(t.last_at, EXCLUDED.last_at),
    pruned_at = now()
  RETURNING 1
)
SELECT count(*) FROM gone
"""

_CREATES = f"""
WITH victims AS (
  SELECT c.id FROM upstream_creates c
  WHERE c.intent_at < :cut AND {_JOB_SETTLED.format(t="c")}
    AND NOT (c.fate IS NULL AND c.state IN ('sending', 'ambiguous'))
    AND c.fate IS DISTINCT FROM 'orphan_billed'
  ORDER BY c.intent_at LIMIT :n FOR UPDATE OF c SKIP LOCKED
), gone AS (
  DELETE FROM upstream_creates c USING victims v WHERE c.id = v.id
  RETURNING c.job_id, c.intent_at, c.task_id
), per_job AS (
  SELECT job_id, count(*) AS n,
         coalesce(array_agg(task_id ORDER BY intent_at) FILTER (WHERE task_id IS NOT NULL), '{{}}') AS task_ids
  FROM gone GROUP BY job_id
), kept AS (
  -- Only a job that was reconciled has a summary (its attempts were pruned first, as old or
  -- older): a generation that never got stuck leaves nothing behind, or the summaries would
  -- grow as fast as the ledger did.
  UPDATE {TOMBSTONES} t SET creates = t.creates + p.n, task_ids = t.task_ids || p.task_ids, pruned_at = now()
  FROM per_job p WHERE t.job_id = p.job_id
  RETURNING 1
)
SELECT count(*) FROM gone
"""

_TOMBSTONES = f"""
WITH victims AS (
  SELECT t.job_id FROM {TOMBSTONES} t WHERE t.last_at < :cut
  ORDER BY t.last_at LIMIT :n FOR UPDATE SKIP LOCKED
), gone AS (
  DELETE FROM {TOMBSTONES} t USING victims v WHERE t.job_id = v.job_id RETURNING 1
)
SELECT count(*) FROM gone
"""

# The breaker prunes each provider's rows as it writes new ones; a provider no longer polled
# leaves its last rows behind, which this removes (by the (provider, at) index, per provider).
_POLL_ANSWERS = """
WITH victims AS (
  SELECT a.id FROM (SELECT DISTINCT provider FROM provider_poll_answers) p
  CROSS JOIN LATERAL (
    SELECT id FROM provider_poll_answers x WHERE x.provider = p.provider AND x.at < :cut
    ORDER BY x.at LIMIT :n FOR UPDATE SKIP LOCKED
  ) a
  LIMIT :n
), gone AS (
  DELETE FROM provider_poll_answers x USING victims v WHERE x.id = v.id RETURNING 1
)
SELECT count(*) FROM gone
"""

# The KIE balance chain (migration 151): per provider, everything before the first sample that
# must stay (the head, a sample of a spend day not final yet, or the one such a sample measures
# from) goes, oldest first: a batch is a prefix of the chain, so the sample after it is the only
# one left pointing at a deleted row, and it becomes the chain's first (previous_id NULL: the
# unique index allows one first per provider, and the old first is deleted by the same
# statement). The one-time filter ``(SELECT count(*) FROM gone) > 0`` makes every delete happen
# before that update; the foreign key is checked at the statement's end, when nothing points at
# a deleted sample. Plain FOR UPDATE, not SKIP LOCKED: a skipped sample would break the prefix
# (only a run extending the head ever locks a sample, and the head is never deleted).
_BALANCE_SAMPLES = """
WITH keep AS (
  SELECT s.provider, min(LEAST(s.id, COALESCE(s.previous_id, s.id))) AS keep_from
  FROM recon_balance_samples s
  WHERE s.sampled_at >= :cut
     OR s.id IN (SELECT max(h.id) FROM recon_balance_samples h GROUP BY h.provider)
  GROUP BY s.provider
), victims AS (
  SELECT s.id FROM recon_balance_samples s JOIN keep k ON k.provider = s.provider
  WHERE s.id < k.keep_from
  ORDER BY s.id LIMIT :n FOR UPDATE OF s
), gone AS (
  DELETE FROM recon_balance_samples s USING victims v WHERE s.id = v.id RETURNING s.id
), relinked AS (
  UPDATE recon_balance_samples s SET previous_id = NULL
  WHERE (SELECT count(*) FROM gone) > 0
    AND s.previous_id IN (SELECT id FROM gone) AND s.id NOT IN (SELECT id FROM gone)
  RETURNING 1
)
SELECT count(*) FROM gone
"""

TABLES: tuple[tuple[str, str, str], ...] = (
    # (table, statement, which cutoff)
    ("reconcile_events", _EVENTS, "events"),
    ("reconcile_decisions", _DECISIONS, "decisions"),
    ("upstream_creates", _CREATES, "creates"),
    (TOMBSTONES, _TOMBSTONES, "tombstones"),
    ("provider_poll_answers", _POLL_ANSWERS, "poll_answers"),
    ("recon_balance_samples", _BALANCE_SAMPLES, "balance_samples"),
)


def prune_batch(engine: sa.Engine, table: str, cut: datetime, batch: int) -> int:
    """Delete at most ``batch`` of ``table``'s rows older than ``cut`` that no guard keeps, in one
    short transaction; the number deleted."""
    statement = {name: text for name, text, _ in TABLES}[table]
    with engine.begin() as conn:
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'")
        return int(conn.execute(sql(statement), {"cut": cut, "n": batch}).scalar_one())


@dataclass
class PassReport:
    """What one pass deleted per table, how many statements it took, and whether it finished."""

    deleted: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    seconds: float = 0.0
    finished: bool = True  # False: the time budget ran out with rows left
    slowest_batch_s: float = 0.0
    errors: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        parts = ", ".join(f"{t} {n}" for t, n in self.deleted.items() if n) or "nothing"
        more = "" if self.finished else " (time budget used up: the next pass goes on)"
        return f"pruned {parts} in {self.batches} batch(es), {self.seconds:.1f} s{more}"


def prune_pass(
    engine: sa.Engine,
    cuts: Cutoffs,
    *,
    batch: int,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> PassReport:
    """Every table in turn, batch by batch until it has nothing left to prune or the time budget
    is spent. A table whose statement fails (a lock timeout, say) is reported and left for the
    next pass; the other tables still go."""
    report = PassReport()
    start = clock()
    for table, _, which in TABLES:
        report.deleted[table] = 0
        cut = getattr(cuts, which)
        if cut is None:
            continue
        while True:
            if clock() - start >= budget_s:
                report.finished = False
                break
            t0 = clock()
            try:
                n = prune_batch(engine, table, cut, batch)
            except sa.exc.DBAPIError as exc:
                report.errors[table] = str(exc.orig or exc).strip().splitlines()[0]
                report.finished = False
                break
            report.batches += 1
            report.slowest_batch_s = max(report.slowest_batch_s, clock() - t0)
            report.deleted[table] += n
            if n < batch:
                break
    report.seconds = clock() - start
    return report


# --- which job_story pages may go -------------------------------------------------------------------

# Of the given job ids, those whose job ended before :cut (or that the app deleted), with no
# credits reserved and no reconcile attempt since :cut: never a job in flight.
_ENDED = """
SELECT CAST(k AS text) FROM unnest(CAST(:ids AS uuid[])) AS k
WHERE NOT EXISTS (
        SELECT 1 FROM jobs j WHERE j.id = k
        AND (j.status IN ('pending', 'processing') OR COALESCE(j.completed_at, j.updated_at) >= :cut))
  AND NOT EXISTS (SELECT 1 FROM usage_logs u WHERE u.job_id = k AND u.status = 'reserved')
  AND NOT EXISTS (SELECT 1 FROM reconcile_events e WHERE e.job_id = k AND e.created_at >= :cut)
"""


def ended_before(engine: sa.Engine, job_ids: list[str], cut: datetime) -> list[str]:
    """Which of ``job_ids`` (uuids) ended before ``cut``: a job the app deleted counts as ended
    once its last reconcile attempt is older than ``cut``; a job in flight, with credits
    reserved or reconciled since ``cut`` never does. Reads ``jobs`` and ``usage_logs`` without
    locking them."""
    if not job_ids:
        return []
    with engine.begin() as conn:
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'")
        return [str(r[0]) for r in conn.execute(sql(_ENDED), {"ids": job_ids, "cut": cut})]


# --- what explain shows -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Pruned:
    """What was pruned of one job's history."""

    events: int
    decisions: int
    creates: int
    first_at: datetime | None
    last_at: datetime | None
    last_attempt: int | None
    last_outcome: str | None
    last_run_id: str | None
    task_ids: tuple[str, ...]
    pruned_at: datetime

    def line(self) -> str:
        what = [
            f"{n} {name}"
            for n, name in (
                (self.events, "attempt record(s)"),
                (self.decisions, "shadow decision(s)"),
                (self.creates, "create ledger row(s)"),
            )
            if n
        ]
        span = ""
        if self.first_at and self.last_at:
            span = f" from {self.first_at:%Y-%m-%d %H:%M} to {self.last_at:%Y-%m-%d %H:%M} UTC"
        last = ""
        if self.last_outcome:
            last = f"; the last: attempt {self.last_attempt}, {self.last_outcome}"
            if self.last_run_id:
                last += f" (run {self.last_run_id})"
        tasks = f"; task id(s) {', '.join(self.task_ids)}" if self.task_ids else ""
        return (
            f"{' and '.join(what) or 'nothing'}{span} pruned on {self.pruned_at:%Y-%m-%d} UTC "
            f"(past their retention){last}{tasks}"
        )


def pruned_of(conn: sa.Connection, job_id: str) -> Pruned | None:
    row = conn.execute(
        sql(
            f"SELECT events, decisions, creates, first_at, last_at, last_attempt, last_outcome, last_run_id, "
            f"task_ids, pruned_at FROM {TOMBSTONES} WHERE job_id = :j"
        ),
        {"j": job_id},
    ).first()
    if row is None:
        return None
    return Pruned(
        int(row.events), int(row.decisions), int(row.creates),
        _utc(row.first_at), _utc(row.last_at),
        int(row.last_attempt) if row.last_attempt is not None else None,
        row.last_outcome, row.last_run_id, tuple(row.task_ids or ()), _utc(row.pruned_at) or datetime.now(UTC),
    )  # fmt: skip


def _utc(at: datetime | None) -> datetime | None:
    return at.astimezone(UTC) if at is not None else None
