"""Reconciliation itself: the stale-job sensor, the per-kind reconcile job, the sync sweep and its
schedule."""

import dagster as dg

from recon_dagster.defs.reconcile.failed_runs import release_failed_run_leases
from recon_dagster.defs.reconcile.jobs import reconcile_job, sync_sweep_job
from recon_dagster.defs.reconcile.schedules import sync_sweep_schedule
from recon_dagster.defs.reconcile.sensors import stale_inflight_jobs_sensor
from recon_dagster.defs.reconcile.vanished import fail_vanished_runs

defs = dg.Definitions(
    jobs=[reconcile_job, sync_sweep_job],
    sensors=[stale_inflight_jobs_sensor, release_failed_run_leases, fail_vanished_runs],
    schedules=[sync_sweep_schedule],
)
