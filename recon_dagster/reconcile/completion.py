"""What a won completion writes besides the job row, inside ``finalize_job_with_media``'s settle
transaction: the asset (and who may see it) and the reopen of a workflow the job's node failed."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.sqltext import sql
from recon_dagster.media.base import StoredObject


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


def create_asset(conn: sa.Connection, row: jobs_db.JobRow, obj: StoredObject, provider_kind: str) -> bool:
    """The job's asset row (one per job: a repeat is a no-op); True if this call created it."""
    # An MCP-origin job (its workflow execution names an mcp_client, the column the app's worker
    # gates on; NULL and '' name no client) stays private whatever is_public holds: a worker that
    # died before writing is_public = false must not get it published. Otherwise is_public NULL
    # means the crash-before-creditGuard window: free-tier baseline, public (9.1).
    r = conn.execute(
        sql(
            """
            INSERT INTO assets (user_id, job_id, asset_type, storage_key, url, is_public, metadata)
            SELECT :u, :j, :t, :k, :url,
              CASE WHEN EXISTS (
                     SELECT 1 FROM workflow_executions w
                     WHERE w.id = CAST(:wf AS uuid) AND w.mcp_client <> '')
                   THEN false
                   ELSE COALESCE(CAST(:p AS boolean), true) END,
              CAST(:m AS jsonb)
            ON CONFLICT (job_id) DO NOTHING RETURNING id
            """
        ),
        {
            "u": str(row.user_id),
            "j": str(row.id),
            "t": row.job_type,
            "k": obj.key,
            "url": obj.url,
            "wf": None if row.workflow_execution_id is None else str(row.workflow_execution_id),
            "p": row.is_public,
            "m": jobs_db._json({"provider_kind": provider_kind, "size": obj.size, "sha256": obj.sha256}),
        },
    ).first()
    return r is not None
