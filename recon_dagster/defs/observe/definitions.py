"""What the console shows: backlog, outcomes, error rates, provider health, stuck jobs and the
operator's one-job actions, with the checks that turn red when money or time goes wrong."""

import dagster as dg

from recon_dagster.defs.observe.answers import no_not_found_burst
from recon_dagster.defs.observe.backlog import (
    inflight_backlog,
    no_credit_leak,
    no_stuck_jobs,
    reconcile_health_job,
    reconcile_health_schedule,
)
from recon_dagster.defs.observe.health import provider_health, provider_health_at_startup, provider_health_job
from recon_dagster.defs.observe.ours import no_faults_of_ours
from recon_dagster.defs.observe.outcomes import (
    credit_anomalies,
    no_new_exhausted_jobs,
    provider_outcome_specs,
    reconcile_error_rates,
    reconcile_outcomes,
)
from recon_dagster.defs.observe.sensor_health import reconcile_sensor_ticking
from recon_dagster.defs.observe.severity import no_settle_errors
from recon_dagster.defs.observe.stuck import fail_and_refund_job, retry_job_now, stuck_jobs

defs = dg.Definitions(
    assets=[
        inflight_backlog,
        reconcile_outcomes,
        credit_anomalies,
        reconcile_error_rates,
        stuck_jobs,
        provider_health,
        *provider_outcome_specs,
    ],
    asset_checks=[
        no_credit_leak,
        no_stuck_jobs,
        no_not_found_burst,
        no_new_exhausted_jobs,
        no_settle_errors,
        no_faults_of_ours,
        reconcile_sensor_ticking,
    ],
    jobs=[reconcile_health_job, retry_job_now, fail_and_refund_job, provider_health_job],
    sensors=[provider_health_at_startup],
    schedules=[reconcile_health_schedule],
)
