"""The LoRA-training migration cohort: its asset, shadow-compare check, job and 15-minute schedule."""

import dagster as dg

from recon_dagster.defs.lora.cohort import (
    lora_cohort_matches_legacy,
    lora_training_cohort,
    lora_training_migration_job,
    lora_training_migration_schedule,
)

defs = dg.Definitions(
    assets=[lora_training_cohort],
    asset_checks=[lora_cohort_matches_legacy],
    jobs=[lora_training_migration_job],
    schedules=[lora_training_migration_schedule],
)
