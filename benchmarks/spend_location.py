"""The code location ``spend_beside_backlog.py`` serves: the project's definitions, and one sensor
that plays the spend and orphan schedules fast.

The schedules fire once a day (spend, 01:00 UTC) and every 10 minutes (orphans); a backlog drains
in a few minutes. Every ``SPEND_BENCH_INTERVAL_S`` the sensor requests what one tick of each
schedule requests (the spend schedule evaluated as itself, yesterday's day at every provider; one
orphan sweep), under run keys of its own so none is taken for the one before, until it has played
``SPEND_BENCH_TICKS`` ticks. Runs go through the instance's queue like the schedules' would.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

import dagster as dg

from recon_dagster.definitions import build_defs
from recon_dagster.defs.orphans.sweep import orphan_sweep_job
from recon_dagster.defs.spend.schedules import spend_reconciliation_job, spend_reconciliation_schedule

TICKS = int(os.environ.get("SPEND_BENCH_TICKS", "6"))
INTERVAL_S = int(os.environ.get("SPEND_BENCH_INTERVAL_S", "15"))


@dg.sensor(
    name="spend_and_orphan_schedules_played_fast",
    jobs=[spend_reconciliation_job, orphan_sweep_job],
    minimum_interval_seconds=INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
def schedules_played_fast(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    played = int(context.cursor or 0)
    if played >= TICKS:
        return dg.SensorResult(skip_reason=f"played {played} ticks")
    tick = spend_reconciliation_schedule.evaluate_tick(
        dg.build_schedule_context(
            scheduled_execution_time=datetime.now(UTC), repository_def=context.repository_def
        )
    )
    requests = [
        dg.RunRequest(
            run_key=f"bench-{played}/{r.run_key}",
            partition_key=r.partition_key,
            asset_selection=r.asset_selection,
            job_name="spend_reconciliation_job",
        )
        for r in tick.run_requests or []
    ]
    requests.append(dg.RunRequest(run_key=f"bench-{played}/orphans", job_name="orphan_sweep_job"))
    return dg.SensorResult(run_requests=requests, cursor=str(played + 1))


defs = dg.Definitions.merge(build_defs(), dg.Definitions(sensors=[schedules_played_fast]))
