"""Schedules: the sync sweep every 5 minutes (spec phase 2, independent of the sensor)."""

import dagster as dg

from recon_dagster.defs.reconcile.jobs import sync_sweep_job

sync_sweep_schedule = dg.ScheduleDefinition(
    name="sync_sweep_schedule",
    job=sync_sweep_job,
    cron_schedule="*/5 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Fails and refunds stale sync, task-less and legacy rows (stops the credit leak).",
)
