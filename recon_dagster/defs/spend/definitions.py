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
from recon_dagster.defs.spend.schedules import spend_reconciliation_job, spend_reconciliation_schedule
from recon_dagster.defs.spend.summary import spend_summary

defs = dg.Definitions(
    assets=[*spend_assets, spend_summary, anthropic_spend_hourly],
    jobs=[spend_reconciliation_job, anthropic_spend_hourly_job],
    schedules=[spend_reconciliation_schedule, anthropic_spend_hourly_schedule],
)
