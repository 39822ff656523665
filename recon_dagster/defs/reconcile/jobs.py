"""Dagster jobs: ``reconcile_job`` (partitioned by provider_kind) and ``sync_sweep_job``.

Ops are thin: they hand leased job ids to the ``Reconciler`` and report what happened to each.
Both jobs use the in-process executor: the default one would spawn a second process per run.
"""

import dataclasses
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, NoReturn

import dagster as dg
import pydantic

from recon_dagster.config import settings as read_settings
from recon_dagster.core.kinds import KINDS
from recon_dagster.core.runtags import NOT_SENT_TAG, OUTCOME_TAG, ROLE_TAG, RUN_KEY_TAG, job_tags, kind_tags
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.jobs import Claim
from recon_dagster.defs.explain.stories import record_stories, worked_jobs
from recon_dagster.defs.observe.health import report_health
from recon_dagster.defs.observe.ours import flag_ours
from recon_dagster.defs.observe.outcomes import provider_kind_partitions, report_outcomes
from recon_dagster.defs.observe.severity import flag_money
from recon_dagster.defs.observe.stuck import report_stuck
from recon_dagster.defs.reconcile.console import CONSOLE_RUN_CONFIG, concise_console_logger
from recon_dagster.defs.resources import DatabaseResource, ReconcileSettingsResource
from recon_dagster.defs.settings_check import breaker_policy, shadow_modes
from recon_dagster.defs.telemetry import flush_run, run_span
from recon_dagster.media.store import MediaStore
from recon_dagster.providers import ProvidersResource
from recon_dagster.providers.resource import listing_providers
from recon_dagster.providers.status import MediaRef
from recon_dagster.reconcile.batches import next_attempt
from recon_dagster.reconcile.breaker import NotFoundBreaker
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.reconciler import JobOutcome, Polled, Reconciler, Step, Summary
from recon_dagster.reconcile.shadow import make_reconciler
from recon_dagster.reconcile.verdict import run_verdict

# Dagster's tag for a sensor's run key (the lease owner of a sensor-requested run).
# The ops of a reconcile run hand each other in-memory values: the run is one process (in-process
# executor), and pickling a 500-job hand-off to disk between steps would buy nothing.
HANDOFF_IO = "handoff_io_manager"


def _list_of(items: Any, what: str, ok: Callable[[Any], bool]) -> list[Any] | None:
    """``items`` as a list whose every element passes ``ok``; a ``ValueError`` naming the first
    element that does not (the run fails at its first op with that line, nothing claimed)."""
    if items is None:
        return None
    if not isinstance(items, list):
        raise ValueError(f"{what} must be a list, got {type(items).__name__}")
    for i, item in enumerate(items):
        if not ok(item):
            raise ValueError(f"{what}[{i}] is {item!r}")
    return items


class ReconcileBatchConfig(dg.Config):
    """The jobs the sensor planned for this run and the attempt each makes (same order). Without
    job ids (Launchpad, a partition backfill) the run works its partition's due jobs itself.

    ``job_ids`` and ``attempts`` are typed ``Any`` for Dagster and checked here instead. Dagster
    walks a typed list element by element each time it resolves a run's config, and it does so
    several times per run (the code server's plan, the worker's plan and its context): ~80 ms
    each time for a 2,000-job batch, 2.7% of a reconcile run's CPU. The config keeps its shape
    (two lists), so queued runs and the Launchpad read as before."""

    job_ids: Any = None  # list[str]: job ids (uuids, parsed when the run claims them)
    attempts: Any = None  # list[int]: the attempt each job makes, same order as job_ids
    lease_owner: str | None = None  # default: the run key

    @pydantic.field_validator("job_ids", mode="before")
    @classmethod
    def _job_ids_are_strings(cls, value: Any) -> list[Any] | None:
        return _list_of(value, "job_ids", lambda item: isinstance(item, str))

    @pydantic.field_validator("attempts", mode="before")
    @classmethod
    def _attempts_are_counts(cls, value: Any) -> list[Any] | None:
        # Any whole number: a poison row's counter can be negative, and the claim settles it.
        return _list_of(value, "attempts", lambda item: type(item) is int)


class _OutcomeLog:
    """Per-job outcome lines for the run's log, sent to Dagster in groups.

    Every ``context.log`` call is one event in Dagster's storage, and dagster-postgres opens a new
    database connection for each: a 200-job batch logged 200 events. Lines are grouped (up to
    ``GROUP`` per event, or whatever arrived within ``MAX_DELAY_S``); a one-job run still gets its
    one line. An errored or force-failed job's line goes out at WARNING in a group of its own, so
    it is not buried among the INFO lines. Called from the reconcile threads, hence the lock.
    """

    GROUP = 50
    MAX_DELAY_S = 5.0
    WARN = (Outcome.ERROR, Outcome.EXHAUSTED)
    UNCOUNTED = (Outcome.NOT_SENT, Outcome.OUR_FAULT)

    def __init__(self, context: dg.OpExecutionContext) -> None:
        self._context = context
        self._lock = threading.Lock()
        self._info: list[str] = []
        self._warn: list[str] = []
        self._since = time.monotonic()

    def __call__(self, o: JobOutcome) -> None:
        # A poll never sent and a failure of ours count no attempt: the line must not say one was made.
        counted = "no attempt counted" if o.outcome in self.UNCOUNTED else f"attempt {o.attempt}"
        line = (
            f"job {o.job_id} [{o.provider_kind or 'no kind'}] {counted}: "
            f"{o.outcome.value} - {o.detail} ({o.duration_ms}ms)"
        )
        with self._lock:
            (self._warn if o.outcome in self.WARN else self._info).append(line)
            pending = len(self._info) + len(self._warn)
            if pending < self.GROUP and time.monotonic() - self._since < self.MAX_DELAY_S:
                return
            info, warn = self._take()
        self._emit(info, warn)

    def _take(self) -> tuple[list[str], list[str]]:
        info, warn = self._info, self._warn
        self._info, self._warn, self._since = [], [], time.monotonic()
        return info, warn

    def _emit(self, info: list[str], warn: list[str]) -> None:
        if warn:
            self._context.log.warning("\n".join(warn))
        if info:
            self._context.log.info("\n".join(info))

    def flush(self) -> None:
        with self._lock:
            info, warn = self._take()
        self._emit(info, warn)


def _reconciler(
    context: dg.OpExecutionContext,
    database: DatabaseResource,
    providers: ProvidersResource | None,
    media_store: MediaStore,
    reconcile_settings: ReconcileSettingsResource,
    on_outcome: _OutcomeLog,
    *,
    listable: frozenset[str] = frozenset(),
) -> Reconciler:
    upstream: Any = providers if providers is not None else _NoUpstream()
    engine = database.get_engine()
    settings = reconcile_settings.settings()
    if listable:
        settings = dataclasses.replace(settings, orphan_listable=listable)
    return make_reconciler(  # the plain Reconciler, or one shadowing some kinds (RECON_MODE)
        engine,
        upstream,
        media_store,
        modes=shadow_modes(),
        breaker=NotFoundBreaker(engine, breaker_policy()),
        settings=settings,
        media_policy=reconcile_settings.media_policy(upstream.media_headers, upstream.media_slot),
        on_outcome=on_outcome,
        run_id=context.run_id,
    )


class _NoUpstream:
    """The sweep never polls; this makes any attempt to do so loud."""

    def poll(self, kind: str, task_id: str) -> NoReturn:
        raise RuntimeError("the sweep job has no provider clients")

    def media_headers(self, kind: str, ref: MediaRef) -> dict[str, str]:
        return {}

    def media_slot(self, kind: str, ref: MediaRef) -> AbstractContextManager[None]:
        return nullcontext()


def _report(
    context: dg.OpExecutionContext, outcomes: list[JobOutcome], summary: Summary
) -> dg.Output[dict[str, Any]]:
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
            "force_failed": summary.exhausted,
            "still_running": summary.still_running,
            "errors": summary.errors,
            # Every job id of a batch run, so the run's page answers "was job X in here?".
            "job_ids": dg.MetadataValue.json(sorted({r["job_id"] for r in rows})),
            "outcomes": dg.MetadataValue.json(rows[:500]),
        },
    )


@dataclass(frozen=True)
class Handoff:
    """What one op of a reconcile run hands the next (in memory: the run is one process)."""

    owner: str  # the lease owner: the run key
    items: tuple[Polled, ...]


def _work_owner(context: dg.OpExecutionContext, config: ReconcileBatchConfig) -> str:
    """The lease owner: the config's, else the run key, else this run (Launchpad, backfill)."""
    return config.lease_owner or context.run.tags.get(RUN_KEY_TAG) or f"run:{context.run_id}"


def _due_claims(context: dg.OpExecutionContext, database: DatabaseResource, limit: int) -> list[Claim]:
    """A run launched without job ids (Launchpad, a partition backfill) works the due jobs of its
    partition's kind itself (all kinds without a partition), claimed like any other run's."""
    kind = context.partition_key if context.has_partition_key else None
    with database.get_engine().connect() as conn:
        rows = jobs_db.scan_stale(conn, limit)
    return [
        Claim(r.id, next_attempt(r))
        for r in rows
        if r.provider_kind in KINDS and kind in (None, r.provider_kind)
    ]


@dg.op(
    out={
        "settled": dg.Out(
            list,
            io_manager_key=HANDOFF_IO,
            description="Outcomes decided at the claim: skipped, exhausted on takeover.",
        ),
        "succeeded": dg.Out(
            Handoff,
            is_required=False,
            io_manager_key=HANDOFF_IO,
            description="Upstream succeeded: to finalize.",
        ),
        "failed": dg.Out(
            Handoff,
            is_required=False,
            io_manager_key=HANDOFF_IO,
            description="Upstream failed, or nothing to poll: to fail.",
        ),
        "unfinished": dg.Out(
            Handoff,
            is_required=False,
            io_manager_key=HANDOFF_IO,
            description="Still running or errored: to count; never sent: to reschedule.",
        ),
    }
)
def claim_and_poll(
    context: dg.OpExecutionContext,
    config: ReconcileBatchConfig,
    database: DatabaseResource,
    providers: ProvidersResource,
    media_store: dg.ResourceParam[MediaStore],
    reconcile_settings: ReconcileSettingsResource,
) -> Iterator[dg.Output[list[JobOutcome]] | dg.Output[Handoff]]:
    """Take the lease on this run's jobs now that it has started, then poll upstream for each.

    The sensor planned the jobs and the attempt each makes; a job whose row moved on since (an
    attempt counted, another run holds it, terminal) is skipped. Nothing but the lease is written.
    """
    owner = _work_owner(context, config)
    if config.job_ids is None:
        planned = _due_claims(context, database, reconcile_settings.scan_limit)
    else:
        attempts = config.attempts or []
        if attempts and len(attempts) != len(config.job_ids):
            raise dg.Failure(f"{len(config.job_ids)} job ids but {len(attempts)} attempts in the run config")
        try:
            planned = [
                Claim(uuid.UUID(j), attempts[i] if attempts else 0) for i, j in enumerate(config.job_ids)
            ]
        except ValueError as exc:
            raise dg.Failure(f"bad job id in the run config: {exc}") from None
        if not attempts:  # ids without attempts (a hand-written config): the attempt each is due
            with database.get_engine().connect() as conn:
                rows = jobs_db.load_jobs(conn, [c.job_id for c in planned])
            planned = [Claim(r.id, next_attempt(r)) for r in rows]
    outcome_log = _OutcomeLog(context)
    rec = _reconciler(context, database, providers, media_store, reconcile_settings, outcome_log)
    with run_span(context, "claim_and_poll"):
        rows, settled = rec.claim(planned, owner)
        _tag_jobs(context, [r.id for r in rows])
        polled = rec.poll(rows)
    outcome_log.flush()
    counts = Counter(p.step.value for p in polled)
    context.log.info(
        f"claimed {len(rows)} of {len(planned)} job(s) as {owner}: "
        + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        + (f", settled at claim={len(settled)}" if settled else "")
    )
    yield dg.Output(
        settled,
        "settled",
        metadata={
            "planned": len(planned),
            "claimed": len(rows),
            "job_ids": dg.MetadataValue.json([str(c.job_id) for c in planned]),
        },
    )
    for name, steps in (
        ("succeeded", {Step.FINALIZE}),
        ("failed", {Step.FAIL, Step.SWEEP}),
        ("unfinished", {Step.COUNT, Step.DEFER}),
    ):
        items = tuple(p for p in polled if p.step in steps)
        if items:
            yield dg.Output(Handoff(owner, items), name, metadata={"jobs": len(items)})


def _tag_run(context: dg.OpExecutionContext, tags: dict[str, str]) -> None:
    """Add tags the Runs page shows and filters by (a run's outcome is known only at its end)."""
    try:
        context.instance.add_run_tags(context.run_id, tags)
    except Exception as exc:  # a tag is a convenience: never fail the run's work over it
        context.log.warning(f"could not tag this run with {tags}: {exc}")


def _tag_jobs(context: dg.OpExecutionContext, job_ids: list[uuid.UUID]) -> None:
    """One hidden tag per job this run holds, added once claimed (a Launchpad or backfill run
    learns its jobs only now), so the Runs page's tag filter finds the run by any of its jobs.

    Only the tags the run lacks: a sensor's run carries its jobs' tags from its request, and
    Dagster re-writes every tag it is given that the run already has (one UPDATE each, plus the
    whole run body): a 2,000-job batch spent ~2,000 statements here for nothing."""
    run_tags = context.run.tags
    missing = {k: v for k, v in job_tags(job_ids).items() if run_tags.get(k) != v}
    if missing:
        _tag_run(context, missing)


def _act(
    context: dg.OpExecutionContext,
    handoff: Handoff,
    database: DatabaseResource,
    providers: ProvidersResource,
    media_store: MediaStore,
    reconcile_settings: ReconcileSettingsResource,
) -> dg.Output[list[JobOutcome]]:
    outcome_log = _OutcomeLog(context)
    rec = _reconciler(context, database, providers, media_store, reconcile_settings, outcome_log)
    try:
        with run_span(context, context.op.name):
            outcomes = rec.act(handoff.items, handoff.owner)
    finally:
        outcome_log.flush()
    counts = Counter(o.outcome.value for o in outcomes)
    return dg.Output(outcomes, metadata={k: v for k, v in sorted(counts.items())})


@dg.op(out=dg.Out(list, io_manager_key=HANDOFF_IO))
def finalize_succeeded(
    context: dg.OpExecutionContext,
    succeeded: Handoff,
    database: DatabaseResource,
    providers: ProvidersResource,
    media_store: dg.ResourceParam[MediaStore],
    reconcile_settings: ReconcileSettingsResource,
) -> dg.Output[list[JobOutcome]]:
    """Upstream succeeded: ``finalize_job_with_media`` (media stored, credits committed, asset
    row, workflow reopen) in one guarded transaction per job; a failed media move counts an attempt."""
    return _act(context, succeeded, database, providers, media_store, reconcile_settings)


@dg.op(name="fail_and_refund", out=dg.Out(list, io_manager_key=HANDOFF_IO))
def fail_and_refund_op(
    context: dg.OpExecutionContext,
    failed: Handoff,
    database: DatabaseResource,
    providers: ProvidersResource,
    media_store: dg.ResourceParam[MediaStore],
    reconcile_settings: ReconcileSettingsResource,
) -> dg.Output[list[JobOutcome]]:
    """Upstream failed, lost the task or let its result expire (or there is nothing to poll):
    fail the job and refund its credits to the pools they came from, exactly once."""
    return _act(context, failed, database, providers, media_store, reconcile_settings)


@dg.op(out=dg.Out(list, io_manager_key=HANDOFF_IO))
def count_attempts(
    context: dg.OpExecutionContext,
    unfinished: Handoff,
    database: DatabaseResource,
    providers: ProvidersResource,
    media_store: dg.ResourceParam[MediaStore],
    reconcile_settings: ReconcileSettingsResource,
) -> dg.Output[list[JobOutcome]]:
    """Still running or errored: count the attempt and release the lease until the cadence is
    up; the attempt that reaches the cap force-fails and refunds (``reconcile_exhausted``). A poll
    this process never sent (its account's limiter refused it) is rescheduled, not counted."""
    return _act(context, unfinished, database, providers, media_store, reconcile_settings)


@dg.op(out=dg.Out(dict, io_manager_key=HANDOFF_IO))
def record_outcomes(
    context: dg.OpExecutionContext, outcomes: list[list[JobOutcome]], database: DatabaseResource
) -> dg.Output[dict[str, Any]]:
    """Record what the run did: the outcome assets per provider kind, the run's summary and job
    ids, its ``recon/outcome`` tag, and whether it was an outage (failed by ``outage_check``, the
    step after this)."""
    flat = [o for group in outcomes for o in group]
    summary = Summary(scanned=len(flat)).add(flat)
    report_outcomes(context, flat, database)
    flag_money(context, flat, database)
    flag_ours(context, flat)
    report_health(context, database, {o.provider_kind for o in flat} | _partition(context))
    record_stories(context, database.get_engine(), worked_jobs(flat))  # each job's page (job_story)
    if any(o.outcome not in (Outcome.SKIPPED, Outcome.NOT_SENT) for o in flat):
        report_stuck(context, database)  # what this run changed, shown now
    output = _report(context, flat, summary)
    if summary.not_sent or summary.our_faults:  # claimed, no attempt left: never "ended before claiming"
        _tag_run(context, {NOT_SENT_TAG: str(summary.not_sent + summary.our_faults)})
    verdict = run_verdict(flat, degraded_share=read_settings().health_degraded_share)
    if verdict.tag is not None:
        _tag_run(context, {OUTCOME_TAG: verdict.tag})
    outage = None
    if verdict.failure is not None:
        outage = {
            "reason": verdict.failure,
            "jobs": verdict.jobs,
            "sample": list(verdict.sample),
            "tag": verdict.tag,
        }
    elif summary.errors:
        context.log.warning(f"{summary.errors} of {verdict.jobs} job(s) errored: {summary.line()}")
    flush_run()  # the run's work is done: its metrics and spans are pushed now (OTLP)
    return dg.Output({**output.value, "outage": outage}, metadata=output.metadata)


@dg.op
def outage_check(context: dg.OpExecutionContext, recorded: dict[str, Any]) -> None:
    """Fails the run when none of its jobs got anywhere because their provider did not answer (or
    every one failed inside reconciliation): a red run with a one-line reason naming the provider.
    A job's own bad result never fails it (``recon_dagster.reconcile.verdict``). Its own step,
    after the outcomes were recorded: the run's failure names this check, not the bookkeeping."""
    outage = recorded.get("outage")
    if not outage:
        context.log.debug("not an outage: some job of this run got an answer or none errored")
        return
    raise dg.Failure(
        description=outage["reason"],
        metadata={
            "errored_jobs": outage["jobs"],
            "first_errors": dg.MetadataValue.json(outage["sample"]),
            "recon/outcome": outage.get("tag") or "-",
        },
        allow_retries=False,
    )


def _partition(context: dg.OpExecutionContext) -> set[str | None]:
    return {context.partition_key} if context.has_partition_key else set()


@dg.op(out=dg.Out(dict))
def sweep_unrecoverable_jobs(
    context: dg.OpExecutionContext,
    database: DatabaseResource,
    media_store: dg.ResourceParam[MediaStore],
    reconcile_settings: ReconcileSettingsResource,
) -> dg.Output[dict[str, Any]]:
    """Spec 5.6: fail + refund stale sync, task-less, legacy and unknown-kind rows (a row whose
    create's answer was lost at a provider that lists its tasks only once the orphan sweep looked)."""
    started = time.monotonic()
    outcome_log = _OutcomeLog(context)
    # The sweep never polls (no upstream) and needs no provider's key: it only asks the registry
    # which providers can list their tasks here.
    listable = listing_providers()
    rec = _reconciler(
        context, database, None, media_store, reconcile_settings, outcome_log, listable=listable
    )
    try:
        with run_span(context, "sweep_unrecoverable_jobs"):
            scanned, outcomes = rec.sweep_stale(
                f"sweep:{context.run_id}", limit=reconcile_settings.scan_limit
            )
    finally:
        outcome_log.flush()
        flush_run()
    # The sweep learns its jobs only by sweeping: each job it settled tags it afterwards, so the
    # Runs page's tag filter finds a swept job's run as it finds a reconciled job's.
    _tag_jobs(context, [o.job_id for o in outcomes if o.outcome not in (Outcome.SKIPPED, Outcome.LOST_RACE)])
    report_outcomes(context, outcomes, database)
    record_stories(context, database.get_engine(), worked_jobs(outcomes))
    if outcomes:
        report_stuck(context, database)
    summary = Summary(scanned=scanned).add(outcomes)
    summary.elapsed_ms = int((time.monotonic() - started) * 1000)
    return _report(context, outcomes, summary)


# Launchpad and backfill runs of a partition get the kind's tags from here (the sensor's runs
# carry them too): without them the per-provider run limits of dagster.yaml would not apply.
reconcile_partitions = dg.PartitionedConfig(
    partitions_def=provider_kind_partitions,
    run_config_for_partition_key_fn=lambda _key: dict(CONSOLE_RUN_CONFIG),
    tags_for_partition_key_fn=kind_tags,
)


@dg.job(
    config=reconcile_partitions,
    executor_def=dg.in_process_executor,
    logger_defs={"console": concise_console_logger},
    description="Reconcile stale in-flight jobs of one provider kind: claim and poll, then finalize, "
    "fail and refund, or count the attempt; record the outcomes and tag the run (recon/outcome); fail the run "
    "when its provider answered none of its jobs "
    "(outage_check). Runs are requested by the sensor; "
    "launched without job ids (Launchpad, backfill) a run works its partition's due jobs.",
    tags={ROLE_TAG: "reconcile"},
)
def reconcile_job() -> None:
    settled, succeeded, failed, unfinished = claim_and_poll()
    outage_check(
        record_outcomes(
            [settled, finalize_succeeded(succeeded), fail_and_refund_op(failed), count_attempts(unfinished)]
        )
    )


@dg.job(
    config=CONSOLE_RUN_CONFIG,
    executor_def=dg.in_process_executor,
    logger_defs={"console": concise_console_logger},
    description="Phase 2 sweep: stale rows that cannot be recovered are failed and refunded.",
    tags={ROLE_TAG: "sweep"},
)
def sync_sweep_job() -> None:
    sweep_unrecoverable_jobs()
