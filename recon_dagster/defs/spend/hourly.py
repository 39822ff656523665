"""Anthropic's spend per hour: its usage report is hourly, so an hour whose report has become
final is judged on its own, an hour after it did (the daily ``anthropic_spend`` judges the whole
day once it is final). The hourly schedule asks for exactly that hour, so each is judged once."""

from datetime import UTC, datetime, timedelta

import dagster as dg

from recon_dagster.config import Settings, settings
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.defs.spend.assets import anthropic_report
from recon_dagster.defs.spend.reports import FIRST_DAY, GROUP, check_spec, window
from recon_dagster.providers.anthropic.spend import AnthropicUsageResource

ANTHROPIC_HOURLY = dg.AssetKey("anthropic_spend_hourly")
hourly = dg.HourlyPartitionsDefinition(start_date=f"{FIRST_DAY}-00:00", timezone="UTC")


@dg.asset(
    key=ANTHROPIC_HOURLY,
    group_name=f"{GROUP}_hourly",
    partitions_def=hourly,
    kinds={"anthropic", "postgres"},
    check_specs=[check_spec(ANTHROPIC_HOURLY, "tokens", Settings.spend_anthropic_tolerance_tokens.name)],
    description="Anthropic's usage report of one hour (per model and API key) against the tokens "
    "our sync calls recorded that hour; judged once final "
    f"({Settings.spend_anthropic_final_after_s.name} after the hour ends).",
)
def anthropic_spend_hourly(
    context: dg.AssetExecutionContext, anthropic_usage: AnthropicUsageResource, database: DatabaseResource
) -> dg.MaterializeResult:  # type: ignore[type-arg]  # Dagster reads a bare annotation only, with check specs
    start, end = window(context)
    return anthropic_report(context, anthropic_usage, database, start, end)


anthropic_spend_hourly_job = dg.define_asset_job(
    "anthropic_spend_hourly_job",
    selection=[ANTHROPIC_HOURLY],
    # One process for the whole run: the connection budget gives each run worker one share
    # (db/budget.py), and the default executor would give every step a process, and a share, of its own.
    executor_def=dg.in_process_executor,
    description="Reconciles one hour of Anthropic's usage report against our recorded tokens.",
)


def hour_turned_final(at: datetime, delay_s: float) -> str:
    """The partition key of the latest hour whose report is final at ``at``."""
    ended_by = at.astimezone(UTC) - timedelta(seconds=delay_s)
    hour = ended_by.replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    return hour.strftime("%Y-%m-%d-%H:00")


@dg.schedule(
    name="anthropic_spend_hourly_schedule",
    cron_schedule="15 * * * *",
    job=anthropic_spend_hourly_job,
    execution_timezone="UTC",
    description="Every hour, reconciles the hour whose Anthropic usage report has just become final "
    f"({Settings.spend_anthropic_final_after_s.name} after it ended). Stopped until an operator starts it.",
)
def anthropic_spend_hourly_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    at = context.scheduled_execution_time or datetime.now(UTC)
    key = hour_turned_final(at, settings().spend_anthropic_final_after_s)
    return dg.RunRequest(run_key=key, partition_key=key)
