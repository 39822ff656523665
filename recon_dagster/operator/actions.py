"""The operator's actions on one job: retry it now, or fail it and refund its credits (and, in
``operator.orphans``, adopt or cancel a task the orphan sweep found only ``probably_ours``).

Both are guarded writes on an in-flight row, so they are safe against a reconcile run working the
same job at the same moment: ``retry`` only moves the job's next attempt to now (the run that
makes it counts the attempt as any other; the cap still holds), and ``fail`` goes through
``fail_and_refund``, the one guarded fail + refund every other path takes, so whichever of the
operator and a run settles the job first wins and the other changes nothing. Each action is
recorded in ``reconcile_events`` with who asked and why (outcome ``operator_retry`` /
``operator_fail``), so the job's story (``recon-dagster explain``) shows it.
"""

from __future__ import annotations

import getpass
import os
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from recon_dagster.config import Settings, settings
from recon_dagster.core.redaction import redact_secrets
from recon_dagster.db import jobs as jobs_db
from recon_dagster.operator.modes import shadow_modes
from recon_dagster.reconcile.finalize import fail_and_refund
from recon_dagster.reconcile.stop_upstream import stop_task

RETRY = "operator_retry"
FAIL = "operator_fail"
ADOPT = "operator_adopt"  # a probably_ours task adopted onto its job (operator.orphans)
CANCEL = "operator_cancel"  # a probably_ours task cancelled upstream (operator.orphans)
# Outcomes of reconcile_events rows that are operator actions, not reconcile attempts.
OPERATOR_OUTCOMES = (RETRY, FAIL, ADOPT, CANCEL)
MAX_REASON = 500


class OperatorError(ValueError):
    """An action refused: one line saying why (unknown job, terminal job, no reason)."""


@dataclass(frozen=True)
class Done:
    job_id: uuid.UUID
    line: str


def os_user() -> str:
    """Who ran the CLI: the OS user (``RECON_OPERATOR`` overrides it, e.g. under sudo)."""
    explicit = settings().operator
    if explicit:
        return explicit
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (a container): still say something
        return f"uid {os.getuid()}"


def _job_id(raw: str | uuid.UUID) -> uuid.UUID:
    try:
        return uuid.UUID(str(raw).strip())
    except ValueError:
        raise OperatorError(f"{raw!r} is not a job id (a UUID)") from None


def _refuse(conn: sa.Connection, job_id: uuid.UUID, action: str) -> OperatorError:
    """Why an action on ``job_id`` is refused, with how the job ended (who failed it, when), so a
    job id left over from an earlier action is recognised as such."""
    row = jobs_db.load_job(conn, job_id)
    if row is None:
        return OperatorError(f"no job {job_id}")
    ended = conn.execute(
        sa.text(
            "SELECT error_message, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') || ' UTC' AS at "
            "FROM jobs WHERE id = :id"
        ),
        {"id": str(job_id)},
    ).first()
    how = ""
    if ended is not None:
        message = " ".join((ended.error_message or "").split())
        how = (
            f" ({message[:160] + ('…' if len(message) > 160 else '')}; {ended.at})"
            if message
            else f" ({ended.at})"
        )
    return OperatorError(f"job {job_id} is already {row.status}{how}; nothing to {action}")


def _refuse_if_shadowed(row: jobs_db.JobRow | None, action: str) -> None:
    """A kind recon_dagster only shadows (``RECON_MODE`` / ``RECON_SHADOW_KINDS``) has none of its
    app rows changed by it, an operator's action included."""
    if row is None:
        return
    if shadow_modes().shadowed(row.provider_kind):
        raise OperatorError(
            f"job {row.id} is {row.provider_kind or 'of no provider kind'}, which is in shadow mode "
            f"({Settings.mode.name} / {Settings.shadow_kinds.name}): recon_dagster changes none of its rows; enforce the "
            f"kind to {action} it"
        )


def record_action(
    conn: sa.Connection, row: jobs_db.JobRow, outcome: str, who: str, why: str, run_id: str | None
) -> None:
    """The ``reconcile_events`` row of an operator's action on ``row``'s job: who and why."""
    _record(conn, row, outcome, who, why, run_id)


def _record(
    conn: sa.Connection, row: jobs_db.JobRow, outcome: str, who: str, why: str, run_id: str | None
) -> None:
    conn.execute(
        sa.text(
            """
            INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome, detail, run_key, run_id)
            VALUES (:j, :k, :a, :o, :d, :r, :run)
            """
        ),
        {
            "j": str(row.id),
            "k": row.provider_kind,
            "a": row.reconcile_attempts,
            "o": outcome,
            "d": redact_secrets(f"by {who}: {why}")[:2000],
            "r": f"operator:{who}",
            "run": run_id,
        },
    )


def retry_now(
    engine: sa.Engine, job_id: str | uuid.UUID, *, who: str, why: str = "", run_id: str | None = None
) -> Done:
    """Make an in-flight job due now (its cadence wait skipped); the attempt is counted as usual.

    A run holding the job's lease keeps it: the job is due again once that run lets go.
    """
    jid = _job_id(job_id)
    why = " ".join(why.split())[:MAX_REASON] or "retry now"
    with engine.begin() as conn:
        row = jobs_db.load_job(conn, jid)
        _refuse_if_shadowed(row, "retry")
        moved = conn.execute(
            sa.text(
                """
                UPDATE jobs SET reconcile_next_at = now(), updated_at = now()
                WHERE id = :id AND status IN ('pending', 'processing')
                RETURNING reconcile_lease_owner,
                          reconcile_lease_expires_at > now() AS leased
                """
            ),
            {"id": str(jid)},
        ).first()
        if moved is None or row is None:
            raise _refuse(conn, jid, "retry")
        _record(conn, row, RETRY, who, why, run_id)
    held = f"; leased by {moved.reconcile_lease_owner} until that run lets go" if moved.leased else ""
    return Done(
        jid,
        f"job {jid} is due now (attempt {row.reconcile_attempts + 1} of its cap will be counted "
        f"when a run makes it){held}",
    )


def fail_now(
    engine: sa.Engine,
    job_id: str | uuid.UUID,
    *,
    who: str,
    reason: str,
    run_id: str | None = None,
    providers: Any | None = None,
) -> Done:
    """Fail an in-flight job and refund its reservation, through the guarded ``fail_and_refund``;
    refused (nothing written) when the job is already terminal.

    Once the fail has won, the task the job names is stopped upstream (``stop_upstream``): cancelled
    through ``providers`` where the provider can, else handed to the orphan sweep; the line and
    the job's story say which. Without ``providers`` it is handed to the sweep."""
    jid = _job_id(job_id)
    reason = " ".join(reason.split())[:MAX_REASON]
    if not reason:
        raise OperatorError("a reason is required (--reason TEXT): it is recorded with the job")
    with engine.connect() as conn:
        row = jobs_db.load_job(conn, jid)
        if row is None or not row.inflight:
            raise _refuse(conn, jid, "fail")
    _refuse_if_shadowed(row, "fail")
    if not fail_and_refund(engine, jid, f"operator_failed by {who}: {reason}"):
        with engine.connect() as conn:
            raise _refuse(conn, jid, "fail")  # a run settled it first
    stopped = stop_task(engine, providers, row, cancel_now=True)
    upstream = f"; {stopped.line}" if stopped is not None else ""
    with engine.begin() as conn:
        _record(conn, row, FAIL, who, f"{reason}{upstream}", run_id)
    return Done(jid, f"job {jid} failed and its reserved credits refunded ({reason}){upstream}")
