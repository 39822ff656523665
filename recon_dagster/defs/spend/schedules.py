"""When spend is reconciled: each day at 01:00 UTC the day before at every provider, and the day
whose Anthropic usage report has become final since (its ``anthropic_spend`` and the day's summary
again), so every day's Anthropic figure is judged once, final. Stopped until an operator starts it:
it reads every provider's billing record once a day."""

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import dagster as dg

from recon_dagster.config import Settings, settings
from recon_dagster.defs.spend.assets import ANTHROPIC
from recon_dagster.defs.spend.reports import GROUP
from recon_dagster.defs.spend.summary import SUMMARY

spend_reconciliation_job = dg.define_asset_job(
    "spend_reconciliation_job",
    selection=dg.AssetSelection.groups(GROUP),
    # One process for the whole run: the connection budget gives each run worker one share
    # (db/budget.py), and the default executor would give every step a process, and a share, of its own.
    executor_def=dg.in_process_executor,
    description="Reconciles one day's spend at every provider, then the day's summary.",
)


def days_to_reconcile(at: datetime, delay_s: float) -> tuple[date, date | None]:
    """The day before ``at``, and the latest day whose Anthropic report is final at ``at`` when
    that is an earlier day (None when it is the same one)."""
    yesterday = at.astimezone(UTC).date() - timedelta(days=1)
    final_day = (at.astimezone(UTC) - timedelta(seconds=delay_s)).date() - timedelta(days=1)
    return yesterday, (final_day if final_day < yesterday else None)


def spend_days_final_after_s() -> float:
    """How long after a day ends the latest of the providers' reports of it is final: the day's
    spend findings (and what retention must keep for them) change until then. Anthropic's usage
    report fills in last, so its delay is the day's."""
    return float(settings().spend_anthropic_final_after_s)


@dg.schedule(
    name="spend_reconciliation_schedule",
    cron_schedule="0 1 * * *",
    job=spend_reconciliation_job,
    execution_timezone="UTC",
    description="Each day at 01:00 UTC: the day before at every provider, and Anthropic's figure "
    f"(with the summary) of the day whose report became final ({Settings.spend_anthropic_final_after_s.name} "
    "after it ended). Stopped until an operator starts it.",
)
def spend_reconciliation_schedule(context: dg.ScheduleEvaluationContext) -> Iterator[dg.RunRequest]:
    at = context.scheduled_execution_time or datetime.now(UTC)
    yesterday, final_day = days_to_reconcile(at, settings().spend_anthropic_final_after_s)
    day = yesterday.isoformat()
    yield dg.RunRequest(run_key=day, partition_key=day)
    if final_day is not None:
        key = final_day.isoformat()
        yield dg.RunRequest(
            run_key=f"{key}/anthropic-final", partition_key=key, asset_selection=[ANTHROPIC, SUMMARY]
        )
