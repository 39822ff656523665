"""Retention: how long recon_dagster keeps its own rows and runs (the `prune_history` schedule;
docs/operations.md#retention says what is never deleted and why).

A group of ``recon_dagster.config.Settings`` (it inherits this class): see that package."""

from __future__ import annotations

from recon_dagster.config.var import number, whole


class RetentionGroup:
    __slots__ = ()

    # fmt: off
    # retention (what the `prune_history` schedule deletes, and what it never does: docs/operations.md)
    retention_events_days = number(
        90, 7, 3650,
        "`reconcile_events` rows (one per attempt) older than this are deleted by the `prune_history` "
        "schedule, in small batches; what they said is kept per job as one summary row "
        "(`recon_pruned_jobs`) that `explain` shows. Never a row of a job still in flight or with credits "
        "still reserved, nor one younger than an open alert incident.",
        group="retention",
    )
    retention_decisions_days = number(
        30, 7, 3650,
        "`reconcile_decisions` rows (shadow mode) older than this are deleted by `prune_history` (never "
        "those of a job still in flight).",
        group="retention",
    )
    retention_creates_days = number(
        90, 14, 3650,
        "`upstream_creates` rows (the create ledger) older than this are deleted by `prune_history`: never "
        "one of a job in flight or with credits reserved, one the orphan sweep has not judged yet "
        "(`sending`/`ambiguous`), a billed orphan, one inside the orphan sweep's window or of a spend day "
        "not final yet.",
        group="retention",
    )
    retention_pruned_jobs_days = number(
        400, 30, 3650,
        "The per-job summaries `prune_history` leaves (`recon_pruned_jobs`) are themselves deleted this long "
        "after their last attempt.",
        group="retention",
    )
    retention_balance_samples_days = number(
        90, 7, 3650,
        "Balance samples (`recon_balance_samples`, the chain a spend run measures each window on) older "
        "than this are deleted by `prune_history`, oldest first: never the chain's head (the next spend run "
        "measures from it), a sample of a spend day not final yet, or the sample such a one measures from.",
        group="retention",
    )
    retention_job_stories_days = number(
        30, 1, 3650,
        "A `job_story` page (its `recon_job` partition) is deleted by `prune_history` once its job ended "
        "this long ago (or the app deleted it and its last reconcile attempt is this old), a few hundred "
        "a batch; never the page of a job in flight, with credits reserved or reconciled since. Its "
        "materializations go with the runs that recorded them (`RECON_RETENTION_RUNS_DAYS`); "
        "`recon-dagster explain` still tells the job's story.",
        group="retention",
    )
    retention_batch = whole(
        1000, 10, 50_000,
        "Rows one `prune_history` statement deletes, in its own short transaction (lock_timeout 2 s).",
        group="retention",
    )
    retention_pass_s = number(
        300, 5, 3600,
        "A `prune_history` pass stops starting batches after this many seconds; the next pass goes on.",
        group="retention",
    )
    retention_runs_days = number(
        30, 1, 3650,
        "Our Dagster runs (tag `recon/code`) that succeeded or were canceled, older than this, are deleted "
        "through Dagster's instance API by `prune_history` (Dagster OSS keeps runs forever).",
        group="retention",
    )
    retention_failed_runs_days = number(
        90, 1, 3650,
        "Our failed runs (a force-fail, an outage) are kept this long instead (at least "
        "`RECON_RETENTION_RUNS_DAYS`).",
        group="retention",
    )
    # fmt: on
