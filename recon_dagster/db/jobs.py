"""The ``jobs`` table: the stale scan, the reconcile lease, and (from ``transitions``) guarded state
transitions.

Every write here is one statement that asserts the state it believes it owns and reports whether
it won (``RETURNING``). Zero rows means another writer (a worker, a webhook, a user cancel, a
second reconcile run) got there first; the caller stops and announces nothing.

Functions take a SQLAlchemy ``Connection`` so the caller decides the transaction boundary.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from recon_dagster.core.kinds import KINDS, LEGACY_STALE_THRESHOLD, NON_PROVIDER_JOB_TYPES, precall_budget
from recon_dagster.core.types import INFLIGHT_STATUSES, TERMINAL_STATUSES, JobRow
from recon_dagster.db import credits
from recon_dagster.db.sqltext import sql
from recon_dagster.db.timestamps import (
    INT4_MAX,
    _finite,
    readable,
    readable_ts,
    unreadable_columns,
)
from recon_dagster.db.transitions import (
    _json,
    bump_attempts,
    cancel_job,
    complete_job,
    fail_job,
    mark_provider_call_start,
    notify_job_event,
    record_task_created,
    reschedule_not_sent,
    set_progress,
)

# Passed on from the modules that define them: callers read rows and timestamps and write jobs
# through db.jobs. (The names defined here are exported anyway; __all__ makes these explicit.)
__all__ = [
    "INFLIGHT_STATUSES",
    "INT4_MAX",
    "TERMINAL_STATUSES",
    "JobRow",
    "_finite",
    "_json",
    "bump_attempts",
    "cancel_job",
    "complete_job",
    "fail_job",
    "mark_provider_call_start",
    "notify_job_event",
    "readable",
    "readable_ts",
    "record_task_created",
    "reschedule_not_sent",
    "set_progress",
    "unreadable_columns",
]

_TIMESTAMP_COLUMNS = ("provider_call_started_at", "reconcile_lease_expires_at", "created_at", "started_at")


def _nonfinite_list() -> str:
    return unreadable_columns(_TIMESTAMP_COLUMNS, "nonfinite")


# The conversion to Python happens here, on the SQL side: a timestamp Python cannot hold becomes
# NULL plus a named flag, for every reader (scan, load, lease renewal) alike. The WHERE and ORDER BY
# clauses only compare stored values with now() +/- an interval, which never overflows.
_ROW_COLUMNS = (
    "id, status, user_id, job_type, provider_kind, provider_task_id, "
    f"{_finite('provider_call_started_at')}, "
    "reconcile_attempts, reconcile_last_error, reconcile_lease_owner, "
    f"{_finite('reconcile_lease_expires_at')}, "
    "should_watermark, is_public, workflow_execution_id, node_id, progress, "
    f"{_finite('created_at')}, {_finite('started_at')}, {_nonfinite_list()}"
)
_ROW_NAMES = ", ".join(JobRow.__dataclass_fields__)


def _row(m: sa.RowMapping) -> JobRow:
    values = {k: m[k] for k in JobRow.__dataclass_fields__}
    values["nonfinite"] = tuple(values["nonfinite"] or ())
    return JobRow(**values)


# ---------------------------------------------------------------------------------------------
# The stale scan
# ---------------------------------------------------------------------------------------------


def _threshold_case(column: str) -> str:
    """Per-kind stale thresholds as a CASE over provider_kind, built from the registry.

    Unknown kinds fall to the 5-minute sweep threshold.
    """
    arms = " ".join(
        f"WHEN '{k.name}' THEN interval '{int(k.stale_threshold.total_seconds())} seconds'"
        for k in KINDS.values()
    )
    legacy = int(LEGACY_STALE_THRESHOLD.total_seconds())
    return f"CASE {column} {arms} ELSE interval '{legacy} seconds' END"


def _precall_interval(budget: timedelta | None) -> str:
    seconds = (budget if budget is not None else precall_budget()).total_seconds()
    return f"make_interval(secs => {float(seconds)!r})"


_MIN_THRESHOLD_S = int(
    min([k.stale_threshold for k in KINDS.values()] + [LEGACY_STALE_THRESHOLD]).total_seconds()
)

_NON_PROVIDER_TYPES = ", ".join(f"'{t}'" for t in NON_PROVIDER_JOB_TYPES)

# A legacy LoRA training (its Replicate training id only on characters, see recon_dagster.reconcile.lora) is
# waiting for adoption, which gives it a task id to poll; sweeping it first would fail and refund
# a training Replicate may still be running. Same test as adopt_legacy_trainings.
_AWAITS_ADOPTION = """provider_task_id IS NULL AND EXISTS (
      SELECT 1 FROM characters c WHERE c.training_job_id = jobs.id
        AND c.training_status IN ('pending', 'training') AND c.replicate_training_id IS NOT NULL)"""


# Two branches, both served by jobs_inflight_idx (its predicate is status IN (pending, processing)):
#  a) rows with provider_call_started_at: a range scan up to the smallest threshold, refined per
#     kind, walked oldest first so LIMIT stops early;
#  b) rows with no provider_call_started_at: an IS NULL probe of the same index. Such a row has
#     not reached its provider call (queued, pre-call work, or a pre-135 legacy row), so it is due
#     only after the pre-call budget, aged by started_at / created_at. Pipeline wrapper jobs, which
#     never call a provider and so never get a provider_kind (spec 9.1), are not due at all.
# Rows leased by a live reconcile run, or waiting out the reconcile cadence, are not due. ORDER BY
# names jobs.* so it sorts by the stored column (the index order), not the finite-mapped output.
# ``where`` narrows a branch (the sweep's own branches below); each branch has its own LIMIT.
def _timed_branch(name: str, where: str = "") -> str:
    return f"""{name} AS (
{_timed_select(where)}
)"""


def _timed_select(where: str = "") -> str:
    narrow = f" AND {where}" if where else ""
    return f"""  SELECT {_ROW_COLUMNS}, jobs.provider_call_started_at AS stale_since
  FROM jobs
  WHERE status IN ('pending', 'processing'){narrow}
    AND jobs.provider_call_started_at < now() - interval '{_MIN_THRESHOLD_S} seconds'
    AND jobs.provider_call_started_at < now() - {_threshold_case("provider_kind")}
    AND NOT ({_AWAITS_ADOPTION})
    AND (jobs.reconcile_lease_expires_at IS NULL OR jobs.reconcile_lease_expires_at < now())
    AND (reconcile_next_at IS NULL OR reconcile_next_at <= now())
  ORDER BY jobs.provider_call_started_at
  LIMIT :limit"""


def _untimed_branch(name: str, where: str = "") -> str:
    narrow = f" AND {where}" if where else ""
    return f"""{name} AS (
  SELECT {_ROW_COLUMNS}, COALESCE(jobs.started_at, jobs.created_at) AS stale_since
  FROM jobs
  WHERE status IN ('pending', 'processing'){narrow}
    AND jobs.provider_call_started_at IS NULL
    AND NOT (provider_kind IS NULL AND job_type IN ({_NON_PROVIDER_TYPES}))
    AND COALESCE(jobs.started_at, jobs.created_at) < now() - {{precall}}
    AND NOT ({_AWAITS_ADOPTION})
    AND (jobs.reconcile_lease_expires_at IS NULL OR jobs.reconcile_lease_expires_at < now())
    AND (reconcile_next_at IS NULL OR reconcile_next_at <= now())
  ORDER BY COALESCE(jobs.started_at, jobs.created_at)
  LIMIT :limit
)"""


def _due_rows(branches: dict[str, str]) -> str:
    """The union of ``{cte name: cte}`` branches, oldest first, bounded."""
    union = " UNION ALL ".join(f"SELECT * FROM {name}" for name in branches)
    return f"""
WITH {", ".join(branches.values())}
SELECT {_ROW_NAMES} FROM ({union}) due
ORDER BY stale_since
LIMIT :limit
"""


# The stale scan is fair between kinds: one walk of the timed branch per registry kind
# (plus one for rows of no or an unknown kind), each bounded by LIMIT, so a backlog of one kind
# bigger than the limit never hides a newer stale job of another kind. Each walk is the same
# jobs_inflight_idx range scan narrowed by provider_kind; the result takes every kind in turn,
# oldest first within a kind (a round of each kind's oldest, then the next round), then the limit.
_KIND_NAMES = ", ".join(f"('{k}')" for k in KINDS)
_REGISTRY_KINDS = ", ".join(f"'{k}'" for k in KINDS)


def _fair_rows(branches: dict[str, str]) -> str:
    union = " UNION ALL ".join(f"SELECT * FROM {name}" for name in branches)
    return f"""
WITH {", ".join(branches.values())}
SELECT {_ROW_NAMES} FROM (
  SELECT *, row_number() OVER (PARTITION BY provider_kind ORDER BY stale_since) AS kind_turn
  FROM ({union}) due
) taken
ORDER BY kind_turn, stale_since
LIMIT :limit
"""


_STALE_SCAN_TEMPLATE = _fair_rows(
    {
        "timed": f"""timed AS (
  SELECT per_kind.* FROM (VALUES {_KIND_NAMES}) AS registry(kind)
  CROSS JOIN LATERAL ({_timed_select("jobs.provider_kind = registry.kind")}) per_kind
)""",
        "timed_other": _timed_branch(
            "timed_other", f"(jobs.provider_kind IS NULL OR jobs.provider_kind NOT IN ({_REGISTRY_KINDS}))"
        ),
        "untimed": _untimed_branch("untimed"),
    }
)

# The sweep's own read: only rows reconcile.decide.route() sends to the sweep,
# so a backlog of older async rows, which only the sensor's polls can settle, never fills the
# sweep's batch. route() stays the rule (the sweep filters on it again); this selects that set:
#  - task-less rows (legacy rows, sync kinds, async rows that never got a task id): the partial
#    index jobs_taskless_inflight_idx (migration 142), range-scanned or IS NULL-probed like above;
#  - rows with a task id that still cannot be polled (an empty id, no kind, a kind that is not
#    async or not in the registry): rare, with no index of their own; jobs_inflight_idx with a
#    filter, which at worst walks the due in-flight rows, never the whole table.
_TASKLESS = "jobs.provider_task_id IS NULL"
_ASYNC_KINDS = ", ".join(f"'{k.name}'" for k in KINDS.values() if k.is_async)
_UNPOLLABLE_WITH_TASK = (
    "jobs.provider_task_id IS NOT NULL AND (jobs.provider_task_id = '' OR jobs.provider_kind IS NULL "
    f"OR jobs.provider_kind NOT IN ({_ASYNC_KINDS}))"
)
_SWEEP_SCAN_TEMPLATE = _due_rows(
    {
        "taskless_timed": _timed_branch("taskless_timed", _TASKLESS),
        "taskless_untimed": _untimed_branch("taskless_untimed", _TASKLESS),
        "tasked_timed": _timed_branch("tasked_timed", _UNPOLLABLE_WITH_TASK),
        "tasked_untimed": _untimed_branch("tasked_untimed", _UNPOLLABLE_WITH_TASK),
    }
)


def stale_scan_sql(precall: timedelta | None = None) -> str:
    """The stale-scan statement (exposed for EXPLAIN tests and the benchmark).

    ``precall`` is the pre-call budget for rows with no provider_call_started_at; None reads
    ``RECON_PRECALL_BUDGET_S`` (default 3 hours).
    """
    return _STALE_SCAN_TEMPLATE.replace("{precall}", _precall_interval(precall))


def sweep_scan_sql(precall: timedelta | None = None) -> str:
    """The sweep's own statement: the stale scan narrowed to rows that can only be swept."""
    return _SWEEP_SCAN_TEMPLATE.replace("{precall}", _precall_interval(precall))


def scan_stale(conn: sa.Connection, limit: int = 500, *, precall: timedelta | None = None) -> list[JobRow]:
    """In-flight rows past their kind's threshold and due for an attempt, bounded: each kind in
    turn, oldest first within a kind (so one kind's backlog never hides another kind's rows)."""
    # The planner prices each kind's walk as if it read the whole index, which crosses
    # jit_above_cost: compiling took 1.1 s for a 0.1 s scan of a 50,000-row backlog. Off for this
    # transaction only.
    conn.execute(sql("SET LOCAL jit = off"))
    rows = conn.execute(sql(stale_scan_sql(precall)), {"limit": limit}).mappings()
    return [_row(r) for r in rows]


def scan_sweepable(
    conn: sa.Connection, limit: int = 500, *, precall: timedelta | None = None
) -> list[JobRow]:
    """Due rows with nothing to poll (sync, task-less, legacy, unknown kind), oldest first, bounded."""
    rows = conn.execute(sql(sweep_scan_sql(precall)), {"limit": limit}).mappings()
    return [_row(r) for r in rows]


def inflight_counts(conn: sa.Connection, *, precall: timedelta | None = None) -> list[dict[str, Any]]:
    """Per kind: rows in flight, rows past threshold (the pre-call budget for rows that have not
    reached their provider call), rows leased by a reconcile run."""
    counts_sql = f"""
    SELECT COALESCE(provider_kind, '(none)') AS provider_kind,
           count(*) AS inflight,
           count(*) FILTER (
             WHERE CASE WHEN provider_call_started_at IS NULL
                        THEN COALESCE(started_at, created_at) < now() - {_precall_interval(precall)}
                        ELSE provider_call_started_at < now() - {_threshold_case("provider_kind")}
                   END) AS stale,
           count(*) FILTER (WHERE reconcile_lease_expires_at > now()) AS leased,
           max(reconcile_attempts) AS max_attempts
    FROM jobs
    WHERE status IN ('pending', 'processing')
    GROUP BY 1 ORDER BY 1
    """
    return [dict(r) for r in conn.execute(sql(counts_sql)).mappings()]


def inflight_by_age(conn: sa.Connection, bounds_s: Sequence[float]) -> list[dict[str, Any]]:
    """Per kind and age bucket (``bucket``: how many of ``bounds_s``, ascending, the age since the
    provider call, or creation, has passed; a non-finite timestamp is bucket 0): rows in flight
    and rows past threshold (the telemetry gauges; one scan of the in-flight rows)."""
    counts_sql = f"""
    SELECT COALESCE(provider_kind, '(none)') AS provider_kind,
           COALESCE(width_bucket(EXTRACT(EPOCH FROM now() - since), CAST(:bounds AS float8[])), 0) AS bucket,
           count(*) AS inflight,
           count(*) FILTER (
             WHERE CASE WHEN provider_call_started_at IS NULL
                        THEN COALESCE(started_at, created_at) < now() - {_precall_interval(None)}
                        ELSE provider_call_started_at < now() - {_threshold_case("provider_kind")}
                   END) AS stale
    FROM (
      SELECT *, CASE WHEN isfinite(COALESCE(provider_call_started_at, started_at, created_at))
                     THEN COALESCE(provider_call_started_at, started_at, created_at) END AS since
      FROM jobs WHERE status IN ('pending', 'processing')
    ) inflight
    GROUP BY 1, 2 ORDER BY 1, 2
    """
    return [dict(r) for r in conn.execute(sql(counts_sql), {"bounds": list(bounds_s)}).mappings()]


def load_job(conn: sa.Connection, job_id: uuid.UUID | str) -> JobRow | None:
    r = (
        conn.execute(sql(f"SELECT {_ROW_COLUMNS} FROM jobs WHERE id = :id"), {"id": str(job_id)})
        .mappings()
        .first()
    )
    return _row(r) if r else None


# A job's row and its oldest ``reserved`` usage log (None: nothing reserved), as finalize reads them.
RowAndReservation = tuple[JobRow, credits.UsageLog | None]


def _with_reservation_sql(where: str) -> str:
    """Job rows matching ``where`` joined to each one's oldest ``reserved`` usage log
    (``credits.find_reserved_usage_log``'s), ``ul_``-prefixed."""
    return f"""
        SELECT j.*, u.id AS ul_id, u.job_id AS ul_job_id, u.user_id AS ul_user_id,
               u.status AS ul_status, u.amount AS ul_amount, u.metadata AS ul_metadata
        FROM (SELECT {_ROW_COLUMNS} FROM jobs WHERE {where}) j
        LEFT JOIN LATERAL (
          SELECT id, job_id, user_id, status, amount, metadata FROM usage_logs
          WHERE job_id = j.id AND status = 'reserved' ORDER BY created_at LIMIT 1
        ) u ON true
        """


def _row_and_reservation(r: sa.RowMapping) -> RowAndReservation:
    reservation = (
        None
        if r["ul_id"] is None
        else credits.UsageLog(
            r["ul_id"],
            r["ul_job_id"],
            r["ul_user_id"],
            r["ul_status"],
            r["ul_amount"],
            r["ul_metadata"] or {},
        )
    )
    return _row(r), reservation


def load_job_and_reservation(
    conn: sa.Connection, job_id: uuid.UUID | str
) -> tuple[JobRow | None, credits.UsageLog | None]:
    """The row and its oldest ``reserved`` usage log in one statement: finalize's read."""
    r = conn.execute(sql(_with_reservation_sql("id = :id")), {"id": str(job_id)}).mappings().first()
    if r is None:
        return None, None
    return _row_and_reservation(r)


def load_jobs_and_reservations(
    conn: sa.Connection, job_ids: Iterable[uuid.UUID | str]
) -> dict[uuid.UUID, RowAndReservation]:
    """``load_job_and_reservation`` for many jobs in one statement (a missing id is left out)."""
    ids = [str(j) for j in job_ids]
    if not ids:
        return {}
    rows = conn.execute(
        sql(_with_reservation_sql("id = ANY(:ids)")).bindparams(sa.bindparam("ids", type_=pg.ARRAY(pg.UUID))),
        {"ids": ids},
    ).mappings()
    loaded = [_row_and_reservation(r) for r in rows]
    return {row.id: (row, reservation) for row, reservation in loaded}


def load_jobs(conn: sa.Connection, job_ids: Iterable[uuid.UUID | str]) -> list[JobRow]:
    ids = [str(j) for j in job_ids]
    rows = conn.execute(
        sql(f"SELECT {_ROW_COLUMNS} FROM jobs WHERE id = ANY(:ids)").bindparams(
            sa.bindparam("ids", type_=pg.ARRAY(pg.UUID))
        ),
        {"ids": ids},
    ).mappings()
    return [_row(r) for r in rows]


# ---------------------------------------------------------------------------------------------
# The reconcile lease (migration 136)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    job_id: uuid.UUID
    attempt: int


def claim_jobs(
    conn: sa.Connection,
    claims: Sequence[Claim],
    owner: str,
    ttl: timedelta,
    *,
    planned: bool = False,
    cap: int | None = None,
) -> list[Claim]:
    """Take the reconcile lease on jobs whose attempt counter is still what the scan saw.

    With ``planned``, each claim's ``attempt`` is instead the 1-based attempt the claimer planned
    to make (counter + 1, + 1 more for a takeover): a run starting with the sensor's plan.

    Succeeds for rows that are in flight and unleased, leased by ``owner`` already, or whose lease
    expired. Taking over an expired lease of another owner means that run died mid-attempt, so it
    counts as a failed attempt (which keeps a job that crashes its run from looping forever).
    Returns the claims that won, with the attempt number they now carry. The takeover's count
    never passes ``cap`` (a row at the cap keeps its count: its force-fail is being retried) nor
    the column's range; the planned attempt is compared in bigint, so a counter at the integer
    maximum is claimed like any other row (the caller then finds it exhausted).
    """
    if not claims:
        return []
    # Rows are locked in id order and a row another claimer holds right now is skipped, not
    # waited for: two claimers meeting on overlapping jobs in different orders (the sensor's
    # batches, the sweep) never deadlock, and the skipped job is simply theirs.
    stmt = sql(
        """
        WITH wanted AS (
          SELECT * FROM unnest(:ids, :attempts) AS c(id, attempts)
        ), lockable AS (
          SELECT j.id FROM jobs j JOIN wanted c ON c.id = j.id
          WHERE CAST(j.reconcile_attempts AS bigint) + CASE WHEN NOT :planned THEN 0
                WHEN j.reconcile_lease_owner IS NULL OR j.reconcile_lease_owner = :owner THEN 1
                ELSE 2 END = c.attempts
            AND j.status IN ('pending', 'processing')
            AND (j.reconcile_lease_owner IS NULL
                 OR j.reconcile_lease_owner = :owner
                 OR j.reconcile_lease_expires_at < now())
          ORDER BY j.id
          FOR UPDATE OF j SKIP LOCKED
        )
        UPDATE jobs j SET
          reconcile_attempts = CASE
            WHEN j.reconcile_lease_owner IS NULL OR j.reconcile_lease_owner = :owner
              OR j.reconcile_attempts >= LEAST(COALESCE(CAST(:cap AS integer), :int_max), :int_max)
            THEN j.reconcile_attempts ELSE j.reconcile_attempts + 1 END,
          reconcile_last_error = CASE
            WHEN j.reconcile_lease_owner IS NULL OR j.reconcile_lease_owner = :owner
            THEN j.reconcile_last_error
            ELSE 'lease of run ' || j.reconcile_lease_owner || ' expired before it finished' END,
          reconcile_lease_owner = :owner,
          reconcile_lease_expires_at = now() + make_interval(secs => :ttl_s),
          updated_at = now()
        FROM lockable
        WHERE j.id = lockable.id
        RETURNING j.id, j.reconcile_attempts
        """
    ).bindparams(
        sa.bindparam("ids", type_=pg.ARRAY(pg.UUID)),
        sa.bindparam("attempts", type_=pg.ARRAY(sa.BigInteger)),
    )
    rows = conn.execute(
        stmt,
        {
            "ids": [str(c.job_id) for c in claims],
            "attempts": [c.attempt for c in claims],
            "owner": owner,
            "ttl_s": ttl.total_seconds(),
            "planned": planned,
            "cap": cap,
            "int_max": INT4_MAX,
        },
    )
    return [Claim(uuid.UUID(str(r.id)), r.reconcile_attempts) for r in rows]


def renew_lease(conn: sa.Connection, job_id: uuid.UUID, owner: str, ttl: timedelta) -> JobRow | None:
    """Re-assert our lease right before working a job; None means we no longer own it."""
    r = (
        conn.execute(
            sql(
                f"""
            UPDATE jobs SET reconcile_lease_expires_at = now() + make_interval(secs => :ttl_s)
            WHERE id = :id AND reconcile_lease_owner = :owner
              AND status IN ('pending', 'processing')
            RETURNING {_ROW_COLUMNS}
            """
            ),
            {"id": str(job_id), "owner": owner, "ttl_s": ttl.total_seconds()},
        )
        .mappings()
        .first()
    )
    return _row(r) if r else None


def release_leases_of(
    conn: sa.Connection, owner: str, job_ids: Sequence[uuid.UUID] | None, *, expiring_by: datetime
) -> list[uuid.UUID]:
    """Release the leases ``owner`` holds on ``job_ids`` (None: on any in-flight job) that expire
    by ``expiring_by``: a lease renewed after the owner's run ended belongs to a re-execution under
    the same run key and is kept. The attempt counter is untouched: the run that died never
    finished its attempt. Returns the jobs released."""
    ids = sa.bindparam("ids", type_=pg.ARRAY(pg.UUID))
    rows = conn.execute(
        sql(
            """
            UPDATE jobs SET reconcile_lease_owner = NULL, reconcile_lease_expires_at = NULL, updated_at = now()
            WHERE reconcile_lease_owner = :owner AND status IN ('pending', 'processing')
              AND reconcile_lease_expires_at <= :by
              AND (CAST(:all AS boolean) OR id = ANY(:ids))
            RETURNING id
            """
        ).bindparams(ids),
        {"owner": owner, "by": expiring_by, "all": job_ids is None, "ids": [str(j) for j in job_ids or []]},
    )
    return [uuid.UUID(str(r.id)) for r in rows]


def release_lease(conn: sa.Connection, job_id: uuid.UUID, owner: str) -> bool:
    r = conn.execute(
        sql(
            """
            UPDATE jobs SET reconcile_lease_owner = NULL, reconcile_lease_expires_at = NULL
            WHERE id = :id AND reconcile_lease_owner = :owner RETURNING id
            """
        ),
        {"id": str(job_id), "owner": owner},
    ).first()
    return r is not None
