"""``upstream_orphans``: each provider's recent tasks sorted against the create ledger and the jobs,
acted on (adopt, cancel, report; shadowed kinds only record), every 10 minutes; its check
``no_orphaned_upstream_work`` fails while a task of ours runs or billed with nobody to collect it.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg

from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.providers import ProvidersResource
from recon_dagster.telemetry.instruments import ORPHAN_ACTIONS

UPSTREAM_ORPHANS = dg.AssetKey("upstream_orphans")
SAMPLE = 50


@dg.asset(
    key=UPSTREAM_ORPHANS,
    group_name="reconciliation",
    description="Upstream tasks (listed at each provider that lists its tasks; from the create ledger "
    "at one that does not) that no in-flight job owns: ours adopted onto their job or cancelled, "
    "billed orphans reported (orphan_billed anomaly), probably_ours and unknown ones reported and "
    "never cancelled nor adopted.",
    check_specs=[
        dg.AssetCheckSpec(
            "no_orphaned_upstream_work",
            asset=UPSTREAM_ORPHANS,
            description="Fails (ERROR) while a task of ours runs upstream that nobody will collect and the "
            "sweep could not cancel it (shadow mode, a provider without cancel, a refused cancel); "
            "WARN when a task of ours succeeded after its job ended (billed for nothing: orphan_billed), "
            "or a task only resembles a lost create of ours (probably_ours: the operator adopts or "
            "cancels it); passes otherwise. Unknown tasks never fail it.",
        )
    ],
)
def upstream_orphans(
    context: dg.AssetExecutionContext, database: DatabaseResource, providers: ProvidersResource
) -> Iterator[dg.MaterializeResult[Any] | dg.AssetCheckResult]:
    from recon_dagster.operator.orphans import orphan_policy
    from recon_dagster.reconcile.orphan_sweep import sweep_orphans
    from recon_dagster.reconcile.orphans import OrphanAction

    report = sweep_orphans(
        database.get_engine(), providers, orphan_policy(act=True, run_id=context.run.run_id)
    )
    for line in report.to_text().splitlines()[1:]:
        context.log.info(line.strip())
    running = [
        s for s in report.tasks
        if s.verdict.action is OrphanAction.CANCEL and s.done != "cancelled"
    ]  # fmt: skip
    # Newly found this run (an earlier run's are in credit_anomalies already).
    billed = [
        s for s in report.tasks
        if s.verdict.action is OrphanAction.ORPHAN_BILLED and not s.done.startswith("already")
    ]  # fmt: skip
    probable = [s for s in report.tasks if s.verdict.action is OrphanAction.PROBABLY_OURS]
    counts = report.counts()
    for s in report.tasks:
        if s.verdict.action is not OrphanAction.OWNED:
            ORPHAN_ACTIONS.add(1, provider=s.verdict.task.provider, action=s.verdict.action.value)
    if running:
        passed, severity = False, dg.AssetCheckSeverity.ERROR
        why = f"{len(running)} task(s) of ours still running with nobody to collect them: " + ", ".join(
            f"{s.verdict.task.provider} {s.verdict.task.task_id} ({s.done})" for s in running[:5]
        )
    elif billed:
        passed, severity = False, dg.AssetCheckSeverity.WARN
        why = f"{len(billed)} task(s) of ours succeeded after their job ended (orphan_billed): " + ", ".join(
            f"{s.verdict.task.provider} {s.verdict.task.task_id} cost {s.verdict.cost}" for s in billed[:5]
        )
    elif probable:
        passed, severity = False, dg.AssetCheckSeverity.WARN
        why = (
            f"{len(probable)} task(s) only resemble a lost create of ours (probably_ours; never acted on: "
            + ("`recon-dagster orphans --adopt TASK --job JOB` or `--cancel TASK`): ")
            + ", ".join(
                f"{s.verdict.task.provider} {s.verdict.task.task_id} ~ job {s.verdict.job_id}"
                for s in probable[:5]
            )
        )
    else:
        passed, severity, why = True, dg.AssetCheckSeverity.ERROR, None
    if report.errors:
        why = "; ".join([why or "", *(f"{p}: {e}" for p, e in report.errors.items())]).strip("; ")
    yield dg.MaterializeResult(
        metadata={
            "listed": dg.MetadataValue.json(dict(report.listed)),
            **{f"{a.value}": counts.get(a.value, 0) for a in OrphanAction},
            "errors": dg.MetadataValue.json(report.errors),
            "seconds": round(report.seconds, 3),
            "tasks": dg.MetadataValue.json(report.to_json()["tasks"][:SAMPLE]),
        }
    )
    yield dg.AssetCheckResult(
        check_name="no_orphaned_upstream_work",
        passed=passed,
        severity=severity,
        description=why,
        metadata={
            "running_uncollected": len(running),
            "orphan_billed": len(billed),
            "probably_ours": len(probable),
        },
    )


orphan_sweep_job = dg.define_asset_job(
    "orphan_sweep_job",
    selection=dg.AssetSelection.assets(UPSTREAM_ORPHANS),
    executor_def=dg.in_process_executor,
    description="List each provider's recent tasks and adopt, cancel or report the ones no in-flight job owns.",
)

orphan_sweep_schedule = dg.ScheduleDefinition(
    name="orphan_sweep_schedule",
    job=orphan_sweep_job,
    cron_schedule="*/10 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every 10 minutes: the orphan sweep (enforce acts; shadowed kinds only record).",
)
