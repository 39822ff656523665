"""Dagster jobs: ``reconcile_job`` (partitioned by provider_kind) and ``sync_sweep_job``.

Ops are thin: they hand leased job ids to the ``Reconciler`` and report what happened to each.
Both jobs use the in-process executor: the default one would spawn a second process per run.
"""

import threading
import time
from typing import Any

import dagster as dg

from recon_dagster.kinds import KIND_NAMES
from recon_dagster.media.store import MediaStore
from recon_dagster.providers import ProvidersResource
from recon_dagster.reconcile.reconciler import JobOutcome, Reconciler, Summary
from recon_dagster.resources import DatabaseResource, ReconcileSettingsResource

provider_kind_partitions = dg.StaticPartitionsDefinition(list(KIND_NAMES))


class ReconcileBatchConfig(dg.Config):
    """The jobs the sensor leased to this run, and the lease owner (the run key) it used."""

    job_ids: list[str]
    lease_owner: str


class _OutcomeLog:
    """Per-job outcome lines for the run's log, sent to Dagster in groups.

    Every ``context.log`` call is one event in Dagster's storage, and dagster-postgres opens a new
    database connection for each: a 200-job batch logged 200 events. Lines are grouped (up to
    ``GROUP`` per event, or whatever arrived within ``MAX_DELAY_S``); a one-job run still gets its
    one line. Called from the reconcile threads, hence the lock.
    """

    GROUP = 50
    MAX_DELAY_S = 5.0

    def __init__(self, context: dg.OpExecutionContext) -> None:
        self._context = context
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self._since = time.monotonic()

    def __call__(self, o: JobOutcome) -> None:
        line = (
            f"job {o.job_id} [{o.provider_kind or 'no kind'}] attempt {o.attempt}: "
            f"{o.outcome.value} - {o.detail} ({o.duration_ms}ms)"
        )
        with self._lock:
            self._lines.append(line)
            if len(self._lines) < self.GROUP and time.monotonic() - self._since < self.MAX_DELAY_S:
                return
            lines, self._lines, self._since = self._lines, [], time.monotonic()
        self._context.log.info("\n".join(lines))

    def flush(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
        if lines:
            self._context.log.info("\n".join(lines))


def _reconciler(
    context: dg.OpExecutionContext,
    database: DatabaseResource,
    providers: ProvidersResource | None,
    media_store: MediaStore,
    reconcile_settings: ReconcileSettingsResource,
    on_outcome: _OutcomeLog,
) -> Reconciler:
    upstream: Any = providers if providers is not None else _NoUpstream()
    return Reconciler(
        database.get_engine(),
        upstream,
        media_store,
        settings=reconcile_settings.settings(),
        media_policy=reconcile_settings.media_policy(upstream.media_headers),
        on_outcome=on_outcome,
    )


class _NoUpstream:
    """The sweep never polls; this makes any attempt to do so loud."""

    def poll(self, kind: str, task_id: str):  # noqa: ANN201
        raise RuntimeError("the sweep job has no provider clients")

    def media_headers(self, kind, ref):  # noqa: ANN001, ANN201
        return {}


def _report(context: dg.OpExecutionContext, outcomes: list[JobOutcome], summary: Summary) -> dg.Output:
    context.log.info(summary.line())
    rows = [
        {
            "job_id": str(o.job_id),
            "provider_kind": o.provider_kind,
            "outcome": o.outcome.value,
            "attempt": o.attempt,
            "detail": o.detail,
        }
        for o in outcomes
    ]
    return dg.Output(
        {"scanned": summary.scanned, "outcomes": [r["outcome"] for r in rows]},
        metadata={
            "summary": summary.line(),
            "recovered": summary.recovered,
            "failed": summary.failed,
            "still_running": summary.still_running,
            "errors": summary.errors,
            "outcomes": dg.MetadataValue.json(rows[:500]),
        },
    )


@dg.op(out=dg.Out(dict))
def reconcile_leased_jobs(
    context: dg.OpExecutionContext,
    config: ReconcileBatchConfig,
    database: DatabaseResource,
    providers: ProvidersResource,
    media_store: dg.ResourceParam[MediaStore],
    reconcile_settings: ReconcileSettingsResource,
) -> dg.Output:
    """Poll upstream for each leased job, then finalize, fail+refund, or count the attempt."""
    started = time.monotonic()
    if context.has_partition_key:
        context.log.info(f"{len(config.job_ids)} job(s) of kind {context.partition_key}")
    outcome_log = _OutcomeLog(context)
    rec = _reconciler(context, database, providers, media_store, reconcile_settings, outcome_log)
    try:
        outcomes = rec.reconcile_many(config.job_ids, config.lease_owner)
    finally:
        outcome_log.flush()
    summary = Summary(scanned=len(config.job_ids)).add(outcomes)
    summary.elapsed_ms = int((time.monotonic() - started) * 1000)
    return _report(context, outcomes, summary)


@dg.op(out=dg.Out(dict))
def sweep_unrecoverable_jobs(
    context: dg.OpExecutionContext,
    database: DatabaseResource,
    media_store: dg.ResourceParam[MediaStore],
    reconcile_settings: ReconcileSettingsResource,
) -> dg.Output:
    """Spec 5.6: fail + refund stale sync, task-less, legacy and unknown-kind rows."""
    started = time.monotonic()
    outcome_log = _OutcomeLog(context)
    rec = _reconciler(context, database, None, media_store, reconcile_settings, outcome_log)
    try:
        scanned, outcomes = rec.sweep_stale(f"sweep:{context.run_id}", limit=reconcile_settings.scan_limit)
    finally:
        outcome_log.flush()
    summary = Summary(scanned=scanned).add(outcomes)
    summary.elapsed_ms = int((time.monotonic() - started) * 1000)
    return _report(context, outcomes, summary)


@dg.job(
    partitions_def=provider_kind_partitions,
    executor_def=dg.in_process_executor,
    description="Reconcile stale in-flight jobs of one provider kind (runs are requested by the sensor).",
    tags={"recon/role": "reconcile"},
)
def reconcile_job() -> None:
    reconcile_leased_jobs()


@dg.job(
    executor_def=dg.in_process_executor,
    description="Phase 2 sweep: stale rows that cannot be recovered are failed and refunded.",
    tags={"recon/role": "sweep"},
)
def sync_sweep_job() -> None:
    sweep_unrecoverable_jobs()
