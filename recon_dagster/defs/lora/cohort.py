"""The LoRA-training migration cohort (spec D3): adopt legacy character trainings onto the reconcile
path as ``replicate-training`` jobs, and shadow-compare each settled one with the legacy cron's
verdict (``recon_dagster.reconcile.lora``), every 15 minutes.
"""

from typing import Any

import dagster as dg

from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.providers import ProvidersResource

LORA_COHORT = dg.AssetKey("lora_training_cohort")


@dg.asset(
    key=LORA_COHORT,
    group_name="reconciliation",
    description="Legacy character trainings adopted onto the reconcile path "
    "(provider_kind = replicate-training), and what is left for the legacy cron.",
)
def lora_training_cohort(
    context: dg.AssetExecutionContext, database: DatabaseResource
) -> dg.MaterializeResult[Any]:
    from recon_dagster.defs.settings_check import shadow_modes
    from recon_dagster.reconcile import lora

    # Adoption writes the app's jobs rows: not while the training kind is only shadowed
    # (RECON_MODE / RECON_SHADOW_KINDS); then the cohort says what it would adopt.
    shadowed = shadow_modes().shadowed(lora.KIND)
    with database.get_engine().begin() as conn:
        adopted = lora.adoptable_trainings(conn) if shadowed else lora.adopt_legacy_trainings(conn)
        orphans = lora.orphan_trainings(conn)
    verb = "shadow: would adopt" if shadowed else "adopted"
    for a in adopted:
        context.log.info(f"{verb} training {a.training_id} of character {a.character_id} (job {a.job_id})")
    return dg.MaterializeResult(
        metadata={
            "mode": "shadow" if shadowed else "enforce",
            "adopted_now": 0 if shadowed else len(adopted),
            "would_adopt": len(adopted) if shadowed else 0,
            "orphans_without_job_row": orphans,
            "adopted": dg.MetadataValue.json(
                [{"job_id": str(a.job_id), "character_id": str(a.character_id)} for a in adopted[:50]]
            ),
        }
    )


@dg.asset_check(
    asset=LORA_COHORT,
    description="Shadow compare: every training reconciliation itself settled (a recovered, failed, "
    "swept or exhausted reconcile event) ends where the legacy reconcileOrphanedTrainings cron would "
    "have put it; a character settled while Replicate still trains is a mismatch. A passing check "
    "over a cohort is the signal to retire the legacy cron, given a minimum cohort: 20 compared, "
    "0 mismatches, 0 orphans. Trainings the app's worker or webhook settled are not counted.",
)
def lora_cohort_matches_legacy(
    database: DatabaseResource, providers: ProvidersResource
) -> dg.AssetCheckResult:
    from recon_dagster.reconcile import lora

    comparisons, settled_elsewhere = lora.shadow_compare(database.get_engine(), providers)
    mismatches = [c for c in comparisons if not c.matches]
    compared = [c for c in comparisons if c.legacy_status is not None]
    with database.get_engine().connect() as conn:
        orphans = lora.orphan_trainings(conn)
    blockers = lora.retirement_blockers(len(compared), len(mismatches), orphans, settled_elsewhere)
    return dg.AssetCheckResult(
        passed=not mismatches,
        severity=dg.AssetCheckSeverity.ERROR,
        description="; ".join(
            f"character {c.character_id} (training {c.training_id}) is {c.new_status}, the legacy cron "
            f"would have it {c.legacy_status}" + (f" ({c.note})" if c.note else "")
            for c in mismatches[:5]
        )
        or None,
        metadata={
            "settled_in_cohort": len(comparisons),
            "compared": len(compared),
            "mismatches": len(mismatches),
            "settled_elsewhere": settled_elsewhere,
            "orphans_without_job_row": orphans,
            "legacy_cron_can_be_retired": not blockers,
            "retirement_blocked_by": "; ".join(blockers) or "nothing",
            "sample": dg.MetadataValue.json(
                [
                    {
                        "character_id": str(c.character_id),
                        "job_id": str(c.job_id),
                        "training_id": c.training_id,
                        "new": c.new_status,
                        "legacy": c.legacy_status,
                        "note": c.note,
                    }
                    for c in (mismatches or comparisons)[:10]
                ]
            ),
        },
    )


lora_training_migration_job = dg.define_asset_job(
    "lora_training_migration_job",
    selection=dg.AssetSelection.assets(LORA_COHORT),
    executor_def=dg.in_process_executor,
    description="Adopt legacy LoRA trainings onto the reconcile path and shadow-compare the cohort.",
)

lora_training_migration_schedule = dg.ScheduleDefinition(
    name="lora_training_migration_schedule",
    job=lora_training_migration_job,
    cron_schedule="*/15 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every 15 minutes: adopt legacy LoRA trainings and shadow-compare the cohort with the legacy cron.",
)
