"""Turning reconciliation on safely: the plan from the Launchpad and the shadow agreement report."""

import dagster as dg

from recon_dagster.defs.rollout.agreement import (
    shadow_agreement,
    shadow_agreement_job,
    shadow_agreement_schedule,
)
from recon_dagster.defs.rollout.plan_job import plan_reconcile

defs = dg.Definitions(
    assets=[shadow_agreement],
    jobs=[plan_reconcile, shadow_agreement_job],
    schedules=[shadow_agreement_schedule],
)
