"""``prune_history``: our tables' and our runs' retention, hourly (docs/operations.md#retention)."""

from datetime import UTC, datetime, timedelta

import dagster as dg
from dagster._check import CheckError  # dagster-shared's, as dagster re-exports it (dagster is declared)

from recon_dagster.config import Settings, settings
from recon_dagster.core.runtags import ROLE_TAG
from recon_dagster.db.retention import Horizons, cutoffs, prune_pass
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.defs.retention.incidents import open_incidents_since
from recon_dagster.defs.retention.runs import REPOSITORY_LABEL_TAG, prune_runs
from recon_dagster.defs.retention.stories import prune_stories
from recon_dagster.defs.spend.schedules import spend_days_final_after_s

DAY = 86_400.0
MAX_RUNS_PER_PASS = 2000


def horizons() -> Horizons:
    now = settings()
    return Horizons(
        events_s=now.retention_events_days * DAY,
        decisions_s=now.retention_decisions_days * DAY,
        creates_s=now.retention_creates_days * DAY,
        tombstones_s=now.retention_pruned_jobs_days * DAY,
        poll_answers_s=now.not_found_window_s,
        orphan_window_s=max(now.orphan_window_s, now.orphan_look_wait_s),
        spend_final_after_s=spend_days_final_after_s(),
        balance_samples_s=now.retention_balance_samples_days * DAY,
    )


@dg.op(
    out=dg.Out(dg.Nothing),
    description="Deletes our tables' rows past their retention in small batches (never a row of a job in "
    "flight or with credits reserved, one younger than an open alert incident, or the ledger's rows the "
    "orphan sweep or a spend day not final yet still read), leaving a per-job summary `explain` shows.",
)
def prune_tables(context: dg.OpExecutionContext, database: DatabaseResource) -> None:
    now = datetime.now(UTC)
    since, keys = open_incidents_since(context.instance)
    cuts = cutoffs(now, horizons(), since)
    if keys:
        context.log.info(
            f"{len(keys)} open incident(s) ({', '.join(keys[:5])}): keeping every row since {since}"
        )
    report = prune_pass(
        database.get_engine(), cuts, batch=settings().retention_batch, budget_s=settings().retention_pass_s
    )
    context.log.info(report.line())
    for table, error in report.errors.items():
        context.log.warning(f"{table}: {error} (left for the next pass)")
    context.add_output_metadata(
        {
            **{f"deleted {t}": n for t, n in report.deleted.items()},
            "batches": report.batches,
            "seconds": round(report.seconds, 3),
            "slowest batch (s)": round(report.slowest_batch_s, 3),
            "finished": report.finished,
            "open incidents": len(keys),
            **{f"cutoff {k}": v.isoformat(timespec="seconds") for k, v in vars(cuts).items()},
        }
    )


@dg.op(
    description="Deletes the job_story pages (recon_job partitions) of jobs that ended past "
    f"{Settings.retention_job_stories_days.name}, a page of keys at a time: never the page of a job in "
    "flight, with credits reserved, reconciled since, or ended since an open alert incident began.",
    ins={"after": dg.In(dg.Nothing)},
    out=dg.Out(dg.Nothing),
)
def prune_job_stories(context: dg.OpExecutionContext, database: DatabaseResource) -> None:
    now = datetime.now(UTC)
    since, _ = open_incidents_since(context.instance)
    cut = now - timedelta(days=settings().retention_job_stories_days)
    cut = min(cut, since) if since is not None else cut
    report = prune_stories(context.instance, database.get_engine(), cut, budget_s=settings().retention_pass_s)
    context.log.info(report.line())
    context.add_output_metadata(
        {
            "deleted job_story pages": report.deleted,
            "kept": report.kept,
            "finished": report.finished,
            "cutoff": cut.isoformat(timespec="seconds"),
        }
    )


@dg.op(
    description="Deletes this code location's finished Dagster runs (and their event logs) past "
    f"{Settings.retention_runs_days.name} through the instance API; failed runs and runs tagged "
    f"recon/outcome are kept {Settings.retention_failed_runs_days.name}; runs of other code locations "
    "are never touched.",
    ins={"after": dg.In(dg.Nothing)},
)
def prune_runs_op(context: dg.OpExecutionContext) -> dg.Output[None]:
    now = settings()
    try:
        ours = context.repository_def.job_names
    except (dg.DagsterInvariantViolationError, CheckError):
        # Executed outside a code location (execute_in_process): which jobs are this location's is
        # unknown, and a run we cannot tell is ours is never deleted.
        context.log.warning("no code location: runs are left alone this time")
        return dg.Output(None, metadata={"deleted runs": 0})
    report = prune_runs(
        context.instance,
        ours,
        now=datetime.now(UTC),
        days=now.retention_runs_days,
        failed_days=now.retention_failed_runs_days,
        our_label=context.run.tags.get(REPOSITORY_LABEL_TAG),
        max_runs=MAX_RUNS_PER_PASS,
        skip={context.run_id},
    )
    context.log.info(report.line())
    return dg.Output(
        None,
        metadata={
            "deleted runs": report.deleted,
            "kept (recon/outcome)": report.kept_outcome,
            "kept (other code location)": report.kept_other_location,
            "finished": report.finished,
        },
    )


@dg.job(
    name="prune_history",
    description="Retention: our tables' rows, then the job_story pages, then our Dagster runs, past their "
    "ages (docs/operations.md#retention).",
    tags={ROLE_TAG: "retention"},
    executor_def=dg.in_process_executor,
)
def prune_history() -> None:
    prune_runs_op(after=prune_job_stories(after=prune_tables()))


prune_history_schedule = dg.ScheduleDefinition(
    name="prune_history_schedule",
    job=prune_history,
    cron_schedule="17 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Hourly: prune_history (small batches, each its own short transaction; a pass stops "
    f"after {Settings.retention_pass_s.name} and the next goes on).",
)
