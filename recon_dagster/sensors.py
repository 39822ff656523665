"""``stale_inflight_jobs_sensor``: scan ``jobs_inflight_idx``, lease what is due, request runs."""

import os
import time
from datetime import timedelta

import dagster as dg

from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.engine import DatabaseUnavailable
from recon_dagster.jobs import reconcile_job
from recon_dagster.reconcile.dispatch import Batch, dispatch, plan_batches
from recon_dagster.reconcile.reconciler import Summary, outcomes_since
from recon_dagster.resources import DatabaseResource, ReconcileSettingsResource


def _sensor_interval_s() -> int:
    """``RECON_SENSOR_INTERVAL_S`` (default 30): seconds between ticks; tests and benchmarks
    shorten it (the daemon's sensor loop itself wakes every 5 s at most)."""
    raw = os.environ.get("RECON_SENSOR_INTERVAL_S", "").strip()
    try:
        value = int(raw) if raw else 30
    except ValueError:
        raise ValueError(f"RECON_SENSOR_INTERVAL_S must be a whole number of seconds, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"RECON_SENSOR_INTERVAL_S must be at least 1, got {raw!r}")
    return value


def run_request_for(batch: Batch) -> dg.RunRequest:
    """One run per batch: partitioned by kind, keyed by its jobs and their attempt numbers."""
    tags = {
        "recon/provider_kind": batch.provider_kind,
        "recon/job_count": str(len(batch.claims)),
    }
    if len(batch.claims) == 1:
        tags["recon/job_id"] = str(batch.claims[0].job_id)
        tags["recon/attempt"] = str(batch.claims[0].attempt)
    else:
        tags["recon/job_id"] = f"{batch.claims[0].job_id} (+{len(batch.claims) - 1} more)"
        tags["recon/attempt"] = ",".join(sorted({str(c.attempt) for c in batch.claims}))
    return dg.RunRequest(
        run_key=batch.run_key,
        partition_key=batch.provider_kind,
        run_config={
            "ops": {
                "reconcile_leased_jobs": {"config": {"job_ids": batch.job_ids, "lease_owner": batch.run_key}}
            }
        },
        tags=tags,
    )


@dg.sensor(
    job=reconcile_job,
    minimum_interval_seconds=_sensor_interval_s(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Finds in-flight jobs past their provider kind's stale threshold and requests "
    "reconcile runs for them, one per job or packed per kind in a backlog.",
)
def stale_inflight_jobs_sensor(
    context: dg.SensorEvaluationContext,
    database: DatabaseResource,
    reconcile_settings: ReconcileSettingsResource,
) -> dg.SensorResult | dg.SkipReason:
    started = time.monotonic()
    now = time.time()
    since = float(context.cursor) if context.cursor else now
    try:
        engine = database.get_engine()
        with engine.begin() as conn:
            rows = jobs_db.scan_stale(conn, reconcile_settings.scan_limit)
            previous = outcomes_since(conn, since)
    except DatabaseUnavailable as exc:
        return dg.SkipReason(f"database unavailable, nothing scanned: {exc}")

    batches = plan_batches(
        rows, batch_size=reconcile_settings.batch_size, single_below=reconcile_settings.single_run_below
    )
    planned = {c.job_id for b in batches for c in b.claims}
    unroutable = [r for r in rows if r.id not in planned]
    for row in unroutable:
        # A legacy row (no provider_kind) belongs to the sweep by design; an unknown kind is news.
        log = context.log.info if row.provider_kind is None else context.log.warning
        log(
            f"job {row.id}: provider_kind {row.provider_kind!r} has no reconcile partition; left to sync_sweep_job"
        )

    won: list[Batch] = []
    errors = 0
    for batch in batches:
        try:  # one bad batch (or row) is logged and skipped, never the whole tick
            with engine.begin() as conn:
                won.extend(
                    dispatch(
                        conn, rows, [batch], lease_ttl=timedelta(seconds=reconcile_settings.lease_seconds)
                    )
                )
        except Exception as exc:  # noqa: BLE001
            errors += 1
            context.log.error(f"could not lease {batch.provider_kind} batch {batch.run_key}: {exc}")

    summary = Summary(scanned=len(rows)).add_counts(previous)
    summary.counts["error"] += errors
    summary.elapsed_ms = int((time.monotonic() - started) * 1000)
    context.log.info(
        f"{summary.line()} dispatched={sum(len(b.claims) for b in won)} runs={len(won)} "
        f"leftToSweep={len(unroutable)}"
    )
    if not won:
        return dg.SensorResult(
            skip_reason=f"no stale job due: scanned={len(rows)} (past threshold, not leased), "
            f"leftToSweep={len(unroutable)}; outcomes since last tick: {summary.line()}",
            cursor=str(now),
        )
    return dg.SensorResult(run_requests=[run_request_for(b) for b in won], cursor=str(now))
