"""Retention: the ``prune_history`` job and its hourly schedule."""

import dagster as dg

from recon_dagster.defs.retention.jobs import prune_history, prune_history_schedule

defs = dg.Definitions(jobs=[prune_history], schedules=[prune_history_schedule])
