"""What a won completion writes, inside ``finalize_job_with_media``'s settle transaction: the job
row locked, then the job row, its credits and its asset in one statement (``settle_completion``),
and the reopen of a workflow the job's node failed."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from recon_dagster.db import credits
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.sqltext import sql
from recon_dagster.db.transitions import COMPLETE_UPDATE, NOTIFY_RETURNING, complete_params
from recon_dagster.media.base import StoredObject
from recon_dagster.telemetry.instruments import CREDITS_COMMITTED, CREDITS_COMMITTED_AMOUNT, add_on_commit


def reopen_sole_cause_workflow(conn: sa.Connection, workflow_execution_id: uuid.UUID, node_id: str) -> bool:
    """Spec 5.7: reopen a workflow that failed only because of this job's node; CAS on 'failed'.

    Sole cause: the workflow lists only this node as failed, and every job of that node in this
    execution has completed (a node can run several jobs: one recovered while a sibling still runs
    must not flip the workflow, since nothing would fail it again if that sibling then fails).
    The last sibling to complete reopens it. Two siblings completing at once would each see the
    other still in flight in their own snapshot, so the workflow row is locked first: the second
    waits for the first to commit and then, in a fresh snapshot, sees it completed.
    """
    params = {"id": str(workflow_execution_id), "node": node_id}
    sole_cause = "status = 'failed' AND failed_nodes = jsonb_build_array(CAST(:node AS text))"
    locked = conn.execute(
        sql(f"SELECT id FROM workflow_executions WHERE id = :id AND {sole_cause} FOR UPDATE"), params
    ).first()
    if locked is None:
        return False
    r = conn.execute(
        sql(
            f"""
            UPDATE workflow_executions w
            SET status = 'completed', failed_nodes = '[]'::jsonb, error_message = NULL, updated_at = now()
            WHERE w.id = :id AND {sole_cause}
              AND NOT EXISTS (
                SELECT 1 FROM jobs o
                WHERE o.workflow_execution_id = w.id AND o.node_id = :node AND o.status <> 'completed')
            RETURNING w.id
            """
        ),
        params,
    ).first()
    return r is not None


# One asset per job without a unique index on the app's assets table (an app may allow several, and
# may already have given a job two: they stay). The insert adds the job's asset only when the job
# has none. That check is race-free because every caller first locks the job row in an earlier
# statement (``lock_job``): in READ COMMITTED each statement reads a fresh snapshot, so a writer
# that held the row and added an asset has committed by then and is seen. (Locked in the same
# statement, the check would read the snapshot taken before the lock wait, and miss it.)
#
# An MCP-origin job (its workflow execution names an mcp_client, the column the app's worker gates
# on; NULL and '' name no client) stays private whatever is_public holds: a worker that died before
# writing is_public = false must not get it published. Otherwise is_public NULL means the
# crash-before-creditGuard window: free-tier baseline, public (9.1). A repeat is a no-op.
def _asset_insert(gate: str = "") -> str:
    return f"""
    INSERT INTO assets (user_id, job_id, asset_type, storage_key, url, is_public, metadata)
    SELECT :u, :j, :t, :k, :url,
      CASE WHEN EXISTS (
             SELECT 1 FROM workflow_executions w
             WHERE w.id = CAST(:wf AS uuid) AND w.mcp_client <> '')
           THEN false
           ELSE COALESCE(CAST(:p AS boolean), true) END,
      CAST(:m AS jsonb)
    WHERE NOT EXISTS (SELECT 1 FROM assets a WHERE a.job_id = CAST(:j AS uuid)){gate}
    RETURNING id"""


_LOCK_JOB = "SELECT id FROM jobs WHERE id = :j FOR UPDATE"


def lock_job(conn: sa.Connection, job_id: uuid.UUID) -> None:
    """Lock the job row for the caller's transaction (see ``_asset_insert``): the first lock of a
    completion, so the order stays the job row, then its usage logs."""
    conn.execute(sql(_LOCK_JOB), {"j": str(job_id)})


def _asset_params(row: jobs_db.JobRow, obj: StoredObject | None, provider_kind: str) -> dict[str, Any]:
    return {
        "u": str(row.user_id),
        "j": str(row.id),
        "t": row.job_type,
        "k": None if obj is None else obj.key,
        "url": None if obj is None else obj.url,
        "wf": None if row.workflow_execution_id is None else str(row.workflow_execution_id),
        "p": row.is_public,
        "m": None
        if obj is None
        else jobs_db._json({"provider_kind": provider_kind, "size": obj.size, "sha256": obj.sha256}),
    }


def create_asset(conn: sa.Connection, row: jobs_db.JobRow, obj: StoredObject, provider_kind: str) -> bool:
    """The job's asset row, unless the job has one (a repeat is a no-op); True if this call created it."""
    lock_job(conn, row.id)
    return conn.execute(sql(_asset_insert()), _asset_params(row, obj, provider_kind)).first() is not None


# One statement for the three writes every won completion makes: the guarded completion (``done``,
# complete_job's UPDATE), the credit commit's common case (credits.sole_commit_ctes) and the asset,
# both gated on ``done`` having won. PostgreSQL runs a data-modifying WITH entry exactly once and to
# completion, and the gates read its RETURNING rows, so they see whether it won. The asset is also
# gated on the job having none (``_asset_insert``), which is why ``lock_job`` runs first, as its own
# statement. Lock order is complete_job's followed by commit_job_credits': the job row first, then
# its usage logs. One row per locked usage log (one row of NULLs when none is locked), each
# carrying ``won`` and ``assets``.
_SETTLE = f"""
    WITH done AS ({COMPLETE_UPDATE} RETURNING id, {NOTIFY_RETURNING}),
    {credits.sole_commit_ctes(" AND EXISTS (SELECT 1 FROM done)")},
    asset AS ({_asset_insert(" AND CAST(:k AS text) IS NOT NULL AND EXISTS (SELECT 1 FROM done)")})
    SELECT (SELECT count(*) FROM done) AS won, (SELECT count(*) FROM asset) AS assets, locked.*
    FROM (SELECT 1) AS one
    LEFT JOIN ({credits.LOCKED_LOGS}) AS locked ON true
    ORDER BY locked.created_at, locked.id"""


@dataclass(frozen=True)
class Settled:
    """What ``settle_completion`` wrote: ``won`` False means nothing at all."""

    won: bool
    usage_log_id: uuid.UUID | None = None  # the committed reservation
    asset_created: bool = False


def settle_completion(
    conn: sa.Connection,
    row: jobs_db.JobRow,
    *,
    output_data: dict[str, Any],
    provider: str | None,
    provider_cost: float | None,
    display_cost: float | None,
    task_id: str | None,
    notify_source: str | None,
    asset: StoredObject | None,
    provider_kind: str,
) -> Settled:
    """``complete_job``, then (only if it won) ``commit_job_credits`` and ``create_asset`` (when
    ``asset`` is given), in the caller's transaction: the same writes under the same guards, sent
    as one statement instead of three, after the job row is locked. The commit's uncommon cases (several reservations, an
    amount that is not money) go on in ``credits.commit_locked`` on the rows the statement locked.
    """
    params = {
        **complete_params(
            row.id,
            output_data=output_data,
            provider=provider,
            provider_cost=provider_cost,
            display_cost=display_cost,
            task_id=task_id,
            notify_source=notify_source,
        ),
        **_asset_params(row, asset, provider_kind),
        "cost": credits.commit_cost(provider_cost),
    }
    lock_job(conn, row.id)  # its own statement: the settle's duplicate check then sees a fresh snapshot
    rows = conn.execute(sql(_SETTLE), params).all()
    if not rows[0].won:
        return Settled(False)
    locked = [r for r in rows if r.id is not None]
    committed = credits.commit_locked(conn, row.id, params["cost"], locked)
    if committed is not None:
        amount = next((r.amount for r in locked if str(r.id) == str(committed)), None)
        add_on_commit(conn, CREDITS_COMMITTED, 1, kind=provider_kind)
        add_on_commit(
            conn, CREDITS_COMMITTED_AMOUNT, float(credits.valid_amount(amount) or 0), kind=provider_kind
        )
    return Settled(True, usage_log_id=committed, asset_created=rows[0].assets > 0)
