"""Spend reconciliation: per provider and day, what the provider billed against what we charged
(assets with checks), the day's summary across providers, the daily job and schedule; Anthropic
also per hour, as its usage report is hourly."""

import dagster as dg

from recon_dagster.defs.spend.assets import spend_assets
from recon_dagster.defs.spend.hourly import (
    anthropic_spend_hourly,
    anthropic_spend_hourly_job,
    anthropic_spend_hourly_schedule,
)
from recon_dagster.defs.spend.reports import GROUP
from recon_dagster.defs.spend.summary import spend_summary

spend_reconciliation_job = dg.define_asset_job(
    "spend_reconciliation_job",
    selection=dg.AssetSelection.groups(GROUP),
    description="Reconciles one day's spend at every provider, then the day's summary.",
)

# Each day, an hour after it ends: most providers have reported it by then (Anthropic's report is
# judged once final, a later run of the same day judges it); KIE's balance is sampled at that time.
spend_reconciliation_schedule = dg.build_schedule_from_partitioned_job(
    spend_reconciliation_job,
    hour_of_day=1,
    minute_of_hour=0,
    name="spend_reconciliation_schedule",
    description="Each day at 01:00 UTC, reconciles the day before at every provider (stopped until "
    "an operator starts it: it reads every provider's billing record once a day).",
)

defs = dg.Definitions(
    assets=[*spend_assets, spend_summary, anthropic_spend_hourly],
    jobs=[spend_reconciliation_job, anthropic_spend_hourly_job],
    schedules=[spend_reconciliation_schedule, anthropic_spend_hourly_schedule],
)
