"""The orphan sweep: its asset and check, job and 10-minute schedule."""

import dagster as dg

from recon_dagster.defs.orphans.sweep import orphan_sweep_job, orphan_sweep_schedule, upstream_orphans

defs = dg.Definitions(assets=[upstream_orphans], jobs=[orphan_sweep_job], schedules=[orphan_sweep_schedule])
