"""Guarded state transitions of a ``jobs`` row, and the worker-side instrumentation writes.

Every write here is one statement that asserts the state it believes it owns and reports whether
it won (``RETURNING``). Zero rows means another writer (a worker, a webhook, a user cancel, a
second reconcile run) got there first; the caller stops and announces nothing.

Functions take a SQLAlchemy ``Connection`` so the caller decides the transaction boundary. Callers
import them from ``recon_dagster.db.jobs`` (re-exported there with the scan and the lease).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from recon_dagster.core.redaction import redact_secrets
from recon_dagster.db import contract
from recon_dagster.db.sqltext import sql
from recon_dagster.db.timestamps import INT4_MAX

# The guarded completion without its RETURNING: complete_job's statement, and the first part of
# the settle statement of reconcile.completion.settle_completion. Parameters: complete_params.
COMPLETE_UPDATE = """
    UPDATE jobs SET status = 'completed', output_data = CAST(:output AS jsonb),
      provider = :provider, provider_cost = :provider_cost, display_cost = :display_cost,
      progress = 100, error_message = NULL, completed_at = now(), updated_at = now(),
      reconcile_lease_owner = NULL, reconcile_lease_expires_at = NULL
    WHERE id = :id AND status IN ('pending', 'processing')
      AND (CAST(:task AS text) IS NULL OR provider_task_id IS NULL OR provider_task_id = :task)"""


def complete_params(
    job_id: uuid.UUID,
    *,
    output_data: dict[str, Any],
    provider: str | None,
    provider_cost: float | None,
    display_cost: float | None,
    task_id: str | None = None,
    notify_source: str | None = None,
) -> dict[str, Any]:
    """``COMPLETE_UPDATE``'s parameters, with ``:notify`` for ``NOTIFY_RETURNING``."""
    return {
        "id": str(job_id),
        "notify": _event(job_id, "completed", notify_source),
        "task": task_id,
        "output": _json(output_data),
        "provider": provider,
        "provider_cost": provider_cost,
        "display_cost": display_cost,
    }


def complete_job(
    conn: sa.Connection,
    job_id: uuid.UUID,
    *,
    output_data: dict[str, Any],
    provider: str | None,
    provider_cost: float | None,
    display_cost: float | None,
    task_id: str | None = None,
    notify_source: str | None = None,
) -> bool:
    """Spec 5.4 step 4: pending/processing -> completed. False: another writer won, or the row
    carries another upstream task than ``task_id`` (None: the result names no task). With
    ``notify_source``, a won write also sends ``notify_job_event``'s event (same statement).

    The spec writes the guard as ``status != 'cancelled'``; asserting the in-flight states is
    strictly narrower: it also refuses to complete a row that already completed (so a second
    finalize gets zero rows, as the spec's race test demands) or that failed and was refunded.
    """
    params = complete_params(
        job_id,
        output_data=output_data,
        provider=provider,
        provider_cost=provider_cost,
        display_cost=display_cost,
        task_id=task_id,
        notify_source=notify_source,
    )
    return (
        conn.execute(sql(f"{COMPLETE_UPDATE} RETURNING id, {NOTIFY_RETURNING}"), params).first() is not None
    )


def fail_job(
    conn: sa.Connection, job_id: uuid.UUID, error_message: str, *, notify_source: str | None = None
) -> bool:
    """pending/processing -> failed. False: the row was already terminal (someone else won).
    With ``notify_source``, a won write also sends ``notify_job_event``'s event (same statement)."""
    r = conn.execute(
        sql(
            f"""
            UPDATE jobs SET status = 'failed', error_message = :err, completed_at = now(),
              updated_at = now(), reconcile_lease_owner = NULL, reconcile_lease_expires_at = NULL
            WHERE id = :id AND status IN ('pending', 'processing')
            RETURNING id, {NOTIFY_RETURNING}
            """
        ),
        {
            "id": str(job_id),
            "err": redact_secrets(error_message),
            "notify": _event(job_id, "failed", notify_source),
        },
    ).first()
    return r is not None


def bump_attempts(
    conn: sa.Connection,
    job_id: uuid.UUID,
    *,
    expected_attempts: int,
    last_error: str | None,
    next_in: timedelta,
    owner: str | None = None,
    cap: int | None = None,
) -> int | None:
    """Count one reconcile attempt that ended without a terminal state.

    Compare-and-set on the attempt counter, so an attempt is never counted twice. Releases the
    lease and schedules the next attempt ``next_in`` from now. Returns the new count, or None if the
    row moved on (terminal, or another run counted this attempt). With ``cap``, a row already at
    or past it keeps its count (its force-fail is being retried; it must not climb). The count
    saturates at the column's maximum, and a negative count (never written by us) jumps to the cap
    (or that maximum), so the caller finds it exhausted.
    """
    r = conn.execute(
        sql(
            """
            UPDATE jobs SET reconcile_attempts = CASE
                WHEN reconcile_attempts < 0 THEN LEAST(COALESCE(CAST(:cap AS integer), :int_max), :int_max)
                WHEN reconcile_attempts >= LEAST(COALESCE(CAST(:cap AS integer), :int_max), :int_max)
                THEN reconcile_attempts ELSE reconcile_attempts + 1 END,
              reconcile_last_error = :err,
              reconcile_next_at = now() + make_interval(secs => :next_s),
              reconcile_lease_owner = NULL, reconcile_lease_expires_at = NULL,
              updated_at = now()
            WHERE id = :id AND reconcile_attempts = :expected
              AND status IN ('pending', 'processing')
              AND (CAST(:owner AS text) IS NULL OR reconcile_lease_owner = :owner
                   OR reconcile_lease_owner IS NULL)
            RETURNING reconcile_attempts
            """
        ),
        {
            "id": str(job_id),
            "expected": expected_attempts,
            "err": None if last_error is None else redact_secrets(last_error),
            "next_s": next_in.total_seconds(),
            "owner": owner,
            "cap": cap,
            "int_max": INT4_MAX,
        },
    ).first()
    return None if r is None else int(r[0])


def reschedule_not_sent(
    conn: sa.Connection, job_id: uuid.UUID, *, expected_attempts: int, owner: str, next_in: timedelta
) -> bool:
    """A reconcile poll this process never sent (its limiter or breaker refused it): release the
    lease and make the job due again ``next_in`` from now, the attempt counter untouched.

    Guarded like ``bump_attempts`` (the counter the run saw, the lease ours or free, in flight);
    False: the row moved on (terminal, or another run counted an attempt). The app's columns
    (status, progress, ``updated_at``) are not touched: nothing happened to the job."""
    r = conn.execute(
        sql(
            """
            UPDATE jobs SET reconcile_next_at = now() + make_interval(secs => :next_s),
              reconcile_lease_owner = NULL, reconcile_lease_expires_at = NULL
            WHERE id = :id AND reconcile_attempts = :expected
              AND status IN ('pending', 'processing')
              AND (reconcile_lease_owner = :owner OR reconcile_lease_owner IS NULL)
            RETURNING id
            """
        ),
        {"id": str(job_id), "expected": expected_attempts, "owner": owner, "next_s": next_in.total_seconds()},
    ).first()
    return r is not None


def set_progress(conn: sa.Connection, job_id: uuid.UUID, progress: int) -> bool:
    r = conn.execute(
        sql(
            """
            UPDATE jobs SET progress = GREATEST(progress, :p), updated_at = now()
            WHERE id = :id AND status IN ('pending', 'processing') RETURNING id
            """
        ),
        {"id": str(job_id), "p": max(0, min(100, int(progress)))},
    ).first()
    return r is not None


def cancel_job(conn: sa.Connection, job_id: uuid.UUID) -> bool:
    """A user cancel, as the app does it: only an in-flight row can be cancelled."""
    r = conn.execute(
        sql(
            """
            UPDATE jobs SET status = 'cancelled', completed_at = now(), updated_at = now()
            WHERE id = :id AND status IN ('pending', 'processing') RETURNING id
            """
        ),
        {"id": str(job_id)},
    ).first()
    return r is not None


def notify_job_event(conn: sa.Connection, job_id: uuid.UUID, status: str, source: str) -> None:
    """A completion event the app can LISTEN for (delivered only if the transaction commits)."""
    conn.execute(sql("SELECT pg_notify('job_events', :payload)"), {"payload": _event(job_id, status, source)})


def _event(job_id: uuid.UUID, status: str, source: str | None) -> str | None:
    return None if source is None else _json({"job_id": str(job_id), "status": status, "source": source})


# In a guarded write's RETURNING: evaluated only for the row it won, so the event goes out exactly
# when a separate notify_job_event after a won write would have (and, like it, only on COMMIT).
NOTIFY_RETURNING = (
    "CASE WHEN CAST(:notify AS text) IS NOT NULL THEN pg_notify('job_events', :notify) END AS notified"
)


# ---------------------------------------------------------------------------------------------
# Worker-side instrumentation (spec 5.2, 5.8)
# ---------------------------------------------------------------------------------------------


def record_task_created(conn: sa.Connection, job_id: uuid.UUID, kind: str, task_id: str) -> str | None:
    """Persist the upstream task id the moment it exists (the ``on_task_created`` write).

    ``provider_call_started_at`` is kept if already set: a stall-retry never moves it (D8).
    If a different task id is already persisted (two workers raced on create), nothing is
    overwritten; the persisted id is returned so the caller can resume it instead.
    Writes only while the row is in flight: a row already completed, failed or cancelled is
    never given a task id (and such a task, or a duplicate, is logged as a credit anomaly). The
    rule is ``recon.attach_task`` (migration 160). Returns the task id now on the row, or None when no in-flight row has
    this id (missing or terminal; the caller tells which apart).
    Raises ValueError (changing nothing) for an empty or non-string task id: such a row could
    never be resumed.
    """
    if not isinstance(task_id, str) or not task_id.strip():
        raise ValueError(f"provider task id must be a non-empty string, got {task_id!r}")
    answer = contract.call(conn, "attach_task", job=str(job_id), kind=kind, task_id=task_id)
    contract.fix_call(answer)
    return str(answer["task_id"]) if answer["next"] in ("poll", "resume") else None


def mark_provider_call_start(conn: sa.Connection, job_id: uuid.UUID, kind: str) -> bool:
    """Sync calls: record kind + start time right before the call; never touches status (5.8).

    Writes only while the row is in flight; False when no in-flight row has this id. The rule is
    ``recon.mark_call_start`` (migration 160)."""
    answer = contract.call(conn, "mark_call_start", job=str(job_id), kind=kind)
    contract.fix_call(answer)
    return bool(answer["next"] == "call")


def _json(value: Any) -> str:
    import json

    return json.dumps(value, default=str, separators=(",", ":"))
