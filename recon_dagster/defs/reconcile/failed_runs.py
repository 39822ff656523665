"""``release_failed_run_leases``: a reconcile run that failed gives its jobs back at once.

A run that dies mid-attempt (a database blip, a lost run worker, a code-server restart) leaves
the jobs it claimed leased to its run key for the whole lease (15 minutes by default), and the
run that finally takes them over counts the dead run's attempt. The run failed, not the jobs:
this sensor releases its leases (nothing else: the attempt counter, the credits and the job stay
as they were), so the stale-jobs sensor retakes them at its next tick, under a fresh run key.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from recon_dagster.core.runtags import RUN_KEY_TAG
from recon_dagster.db import jobs as jobs_db
from recon_dagster.defs.reconcile.jobs import reconcile_job
from recon_dagster.defs.resources import DatabaseResource, ReconcileSettingsResource


def run_lease_owner(run: dg.DagsterRun) -> str:
    """The lease owner a reconcile run claimed its jobs as (as ``claim_and_poll`` chose it)."""
    config = _batch_config(run)
    return str(config.get("lease_owner") or run.tags.get(RUN_KEY_TAG) or f"run:{run.run_id}")


def run_job_ids(run: dg.DagsterRun) -> list[uuid.UUID] | None:
    """The job ids in the run's config (None: a run that scanned for its own jobs)."""
    ids = _batch_config(run).get("job_ids")
    if ids is None:
        return None
    out = []
    for j in ids:
        try:
            out.append(uuid.UUID(str(j)))
        except ValueError:
            continue
    return out


def _batch_config(run: dg.DagsterRun) -> dict[str, Any]:
    run_config: dict[str, Any] = dict(run.run_config or {})
    return dict(run_config.get("ops", {}).get("claim_and_poll", {}).get("config", {}) or {})


@dg.run_failure_sensor(
    name="release_failed_run_leases",
    monitored_jobs=[reconcile_job],
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Releases the leases a failed reconcile run held (its jobs are retaken at the next "
    "tick of stale_inflight_jobs_sensor instead of after the whole lease); no attempt counted.",
)
def release_failed_run_leases(
    context: dg.RunFailureSensorContext,
    database: DatabaseResource,
    reconcile_settings: ReconcileSettingsResource,
) -> None:
    run = context.dagster_run
    owner = run_lease_owner(run)
    record = context.instance.get_run_record_by_id(run.run_id)
    ended = (record.end_time if record is not None else None) or datetime.now(UTC).timestamp()
    # A lease renewed after the run ended is a re-execution's under the same run key: kept.
    by = datetime.fromtimestamp(ended, UTC) + timedelta(seconds=reconcile_settings.lease_seconds + 5)
    with database.get_engine().begin() as conn:
        released = jobs_db.release_leases_of(conn, owner, run_job_ids(run), expiring_by=by)
    if released:
        context.log.info(
            f"run {run.run_id} failed: released the leases of {len(released)} job(s) held as {owner} "
            "(no attempt counted); the next tick retakes them"
        )
