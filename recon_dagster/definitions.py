"""The recon_dagster code location: every job, sensor, schedule and resource, merged here."""

from typing import Any

import dagster as dg

from recon_dagster.agreement import shadow_agreement, shadow_agreement_job, shadow_agreement_schedule
from recon_dagster.assets import (
    inflight_backlog,
    lora_cohort_matches_legacy,
    lora_training_cohort,
    lora_training_migration_job,
    lora_training_migration_schedule,
    no_credit_leak,
    no_stuck_jobs,
    reconcile_health_job,
    reconcile_health_schedule,
)
from recon_dagster.checks import no_not_found_burst
from recon_dagster.explain_job import explain_job
from recon_dagster.health import provider_health, provider_health_at_startup, provider_health_job
from recon_dagster.jobs import HANDOFF_IO, reconcile_job, sync_sweep_job
from recon_dagster.media.store import media_store_from_env
from recon_dagster.outcomes import (
    credit_anomalies,
    error_rate_checks,
    no_new_exhausted_jobs,
    provider_outcome_specs,
    reconcile_error_rates,
    reconcile_outcomes,
    reconcile_run_failure_alert,
)
from recon_dagster.plan_job import plan_reconcile
from recon_dagster.providers import providers_from_env
from recon_dagster.resources import DatabaseResource, ReconcileSettingsResource, with_nested_resources_on_top
from recon_dagster.schedules import sync_sweep_schedule
from recon_dagster.sensors import stale_inflight_jobs_sensor
from recon_dagster.settings import validate_settings
from recon_dagster.severity import no_settle_errors
from recon_dagster.shadow import modes_from_env
from recon_dagster.stuck import fail_and_refund_job, retry_job_now, stuck_jobs


def default_resources() -> dict[str, Any]:
    """Resources wired from the environment (README, Configuration); secrets via dg.EnvVar."""
    return {
        "database": DatabaseResource(),
        "providers": providers_from_env(),
        "media_store": media_store_from_env(),
        "reconcile_settings": ReconcileSettingsResource(),
        HANDOFF_IO: dg.mem_io_manager,
    }


def build_defs(resources: dict[str, Any] | None = None) -> dg.Definitions:
    """The definitions with the default resources, some of them replaced (tests, the demo).

    Every ``RECON_*`` setting is checked first: a bad one is a load error naming its variable."""
    validate_settings()
    modes_from_env()  # a bad RECON_MODE / RECON_*_KINDS fails the code location at load, in one line
    return dg.Definitions(
        assets=[
            inflight_backlog,
            lora_training_cohort,
            reconcile_outcomes,
            credit_anomalies,
            reconcile_error_rates,
            stuck_jobs,
            provider_health,
            *provider_outcome_specs,
            shadow_agreement,
        ],
        asset_checks=[
            no_credit_leak,
            no_stuck_jobs,
            lora_cohort_matches_legacy,
            no_not_found_burst,
            no_new_exhausted_jobs,
            no_settle_errors,
            *error_rate_checks,
        ],
        jobs=[
            reconcile_job,
            sync_sweep_job,
            reconcile_health_job,
            lora_training_migration_job,
            explain_job,
            plan_reconcile,
            shadow_agreement_job,
            retry_job_now,
            fail_and_refund_job,
            provider_health_job,
        ],
        sensors=[stale_inflight_jobs_sensor, reconcile_run_failure_alert, provider_health_at_startup],
        schedules=[
            sync_sweep_schedule,
            reconcile_health_schedule,
            lora_training_migration_schedule,
            shadow_agreement_schedule,
        ],
        resources=with_nested_resources_on_top({**default_resources(), **(resources or {})}),
    )


defs = build_defs()
