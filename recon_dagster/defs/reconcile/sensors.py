"""``stale_inflight_jobs_sensor``: scan ``jobs_inflight_idx``, plan what is due, request runs.

Evaluating the sensor writes nothing (a UI preview or a daemon that dies before submitting changes
no job row): the lease is taken by each run when it starts (``claim_and_poll``).
"""

import json
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from recon_dagster.config import settings
from recon_dagster.core.kinds import KINDS
from recon_dagster.core.runtags import (
    ATTEMPT_TAG,
    JOB_COUNT_TAG,
    LANE_TAG,
    LEGACY_WORK_TAG,
    NOT_SENT_TAG,
    PROVIDER_TAG,
    WORK_TAG,
    job_tags,
    kind_tags,
)
from recon_dagster.core.types import JobRow
from recon_dagster.db.engine import DatabaseUnavailable
from recon_dagster.defs.reconcile.console import CONSOLE_RUN_CONFIG
from recon_dagster.defs.reconcile.jobs import reconcile_job
from recon_dagster.defs.resources import DatabaseResource, ReconcileSettingsResource
from recon_dagster.defs.settings_check import shadow_modes
from recon_dagster.defs.telemetry import requested_run_tags, timed_tick
from recon_dagster.providers.limits import batch_sizes_within_budgets, poll_budgets
from recon_dagster.providers.resource import not_configured, not_configured_line
from recon_dagster.reconcile.batches import Batch, plan_batches, within_poll_budgets
from recon_dagster.reconcile.decide import Route, route
from recon_dagster.reconcile.reconciler import Summary, outcomes_since
from recon_dagster.reconcile.shadow import scan_due

# The scan never reads more rows than this in one tick, however many jobs wait in queued runs.
MAX_SCAN = 50_000


def sensor_interval_s(environ: Mapping[str, str] | None = None) -> int:
    """``RECON_SENSOR_INTERVAL_S`` (default 30): seconds between ticks; tests and benchmarks
    shorten it (the daemon's sensor loop itself wakes every 5 s at most)."""
    return settings(environ).sensor_interval_s


# Runs whose jobs are spoken for. NOT_STARTED is left out on purpose: that is a run the daemon
# created but never submitted (it died in between); re-requesting its jobs under the same run key
# is what makes Dagster submit it after all.
ACTIVE_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
FINISHED_STATUSES = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
# Runs of the same work that ended before claiming it (each failed before its first op) from
# which on the sensor logs an ERROR per tick: a broken deployment, not bad luck. It keeps
# requesting (a transient outage of the code server must not strand jobs).
UNSTARTED_RUNS_LOUD = 3


# A small run (a few fresh stuck jobs, not a backlog: at most one round of polls at the default
# RECON_RECONCILE_CONCURRENCY) is dequeued before the batch runs (Dagster's queued run coordinator
# starts higher priorities first) and may use the provider run slots that batch runs may not
# (dagster.yaml limits "<provider>/batch" two runs below the provider), so another kind's backlog
# never holds it until one of its long runs ends.
SMALL_RUN_PRIORITY = 10
SMALL_RUN_JOBS = 16


CURSOR_KEY = "previous_tick"


def write_cursor(at: float) -> str:
    """The sensor's cursor: when this tick read the outcomes, in ISO 8601 UTC (readable on the
    sensor's page, unlike the bare epoch float of older releases)."""
    return json.dumps({CURSOR_KEY: datetime.fromtimestamp(at, UTC).isoformat()})


def read_cursor(cursor: str | None) -> float | None:
    """The previous tick's time from a cursor of this release or an older one (a bare epoch
    float); None when there is none or it cannot be read (someone edited it)."""
    if not cursor:
        return None
    try:
        return float(cursor)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(json.loads(cursor)[CURSOR_KEY])
    except (ValueError, TypeError, KeyError):
        return None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def _per_provider(batches: list[Batch]) -> str:
    """``kie:120,replicate:4``: jobs per provider, for the tick's log line."""
    counts: Counter[str] = Counter()
    for b in batches:
        counts[str(KINDS[b.provider_kind].provider)] += len(b.claims)
    return ",".join(f"{p}:{n}" for p, n in sorted(counts.items()))


def without_unconfigured(rows: list[JobRow]) -> tuple[list[JobRow], Counter[str]]:
    """``rows`` minus those that need a poll of a provider whose key is not set here, and how many
    of each such provider were left out (a row with nothing to poll still goes: its sweep needs no
    provider)."""
    missing = set(not_configured())
    if not missing:
        return rows, Counter()
    kept: list[JobRow] = []
    left: Counter[str] = Counter()
    for r in rows:
        kind = KINDS.get(r.provider_kind or "")
        provider = kind.provider if kind is not None else None
        if provider in missing and route(r) is Route.POLL:
            left[str(provider)] += 1
        else:
            kept.append(r)
    return kept, left


def unconfigured_due(
    database: DatabaseResource, reconcile_settings: ReconcileSettingsResource
) -> Counter[str]:
    """How many due jobs each provider without its key leaves in flight now (what the sensor's
    tick leaves out with a warning): ``recon-dagster reconcile --once`` fails on it in one line."""
    if not not_configured():
        return Counter()
    with database.get_engine().connect() as conn:
        rows = scan_due(
            conn, MAX_SCAN, reconcile_settings.settings().cadence, modes=shadow_modes(), cap=MAX_SCAN
        )
    return without_unconfigured(rows)[1]


def lane_tags(batch: Batch) -> dict[str, str]:
    provider = str(KINDS[batch.provider_kind].provider)
    if len(batch.claims) <= SMALL_RUN_JOBS:
        return {LANE_TAG: f"{provider}/small", "dagster/priority": str(SMALL_RUN_PRIORITY)}
    return {LANE_TAG: f"{provider}/batch"}


def run_request_for(batch: Batch) -> dg.RunRequest:
    """One run per batch: partitioned by kind, keyed by its jobs and the attempt each makes.

    The run config carries the job ids and attempts; the run claims them when it starts. Visible
    tags: the kind, provider and lane the run queue limits by; the rest (work key, job count,
    attempts, one tag per job, so a queued run is found by its jobs' ids too) is hidden."""
    tags = {
        **kind_tags(batch.provider_kind),
        **lane_tags(batch),
        WORK_TAG: batch.work_key,
        JOB_COUNT_TAG: str(len(batch.claims)),
        ATTEMPT_TAG: ",".join(str(a) for a in sorted(set(batch.attempts))),
        **job_tags([c.job_id for c in batch.claims]),
        **requested_run_tags(batch.run_key, batch.provider_kind, len(batch.claims)),
    }
    return dg.RunRequest(
        run_key=batch.run_key,
        partition_key=batch.provider_kind,
        run_config={
            "ops": {"claim_and_poll": {"config": {"job_ids": batch.job_ids, "attempts": batch.attempts}}},
            **CONSOLE_RUN_CONFIG,
        },
        tags=tags,
    )


def jobs_in_active_runs(instance: dg.DagsterInstance) -> set[uuid.UUID]:
    """Job ids carried by reconcile runs that are queued or running (read from their run config)."""
    return set(active_jobs(instance))


def active_jobs(instance: dg.DagsterInstance) -> dict[uuid.UUID, str | None]:
    """Job ids carried by reconcile runs that are queued or running (read from their run config),
    each with the provider of its run (its ``recon/provider`` tag)."""
    busy: dict[uuid.UUID, str | None] = {}
    for run in instance.get_runs(
        filters=dg.RunsFilter(job_name=reconcile_job.name, statuses=ACTIVE_STATUSES)
    ):
        run_config: dict[str, Any] = dict(run.run_config or {})
        config = run_config.get("ops", {}).get("claim_and_poll", {}).get("config", {})
        provider = run.tags.get(PROVIDER_TAG)
        for job_id in config.get("job_ids") or []:
            try:
                busy[uuid.UUID(str(job_id))] = provider
            except ValueError:
                continue
    return busy


def fresh_keys(instance: dg.DagsterInstance, batches: list[Batch]) -> tuple[list[Batch], list[Batch]]:
    """Give work that an ended run never claimed a fresh run key; returns (batches, stubborn).

    A run that ends leaves a trace on its jobs (an attempt counted, a lease, a terminal state),
    and that trace changes the next key. A run that failed before its first op (the code server
    unreachable, a launch timeout) left none, so the same work would get the same key, which
    Dagster never launches twice: the retry suffix counts the ended runs of that work instead.
    A run whose polls were never sent (its account's limiter refused them) rescheduled its jobs
    without counting an attempt: it leaves no trace either, so it counts for the suffix too, but
    it did claim its jobs (its ``NOT_SENT_TAG`` says so): it never makes the work stubborn.
    ``stubborn`` lists the work that has ended unclaimed ``UNSTARTED_RUNS_LOUD`` times or more.
    """
    if not batches:
        return [], []
    works = sorted({b.work_key for b in batches})
    # Runs requested before the work tag was hidden count too, or their work would get the key
    # of the run that never started again, which Dagster never launches twice.
    runs = [
        (run.tags.get(key), NOT_SENT_TAG in run.tags)
        for key in (WORK_TAG, LEGACY_WORK_TAG)
        for run in instance.get_runs(
            filters=dg.RunsFilter(job_name=reconcile_job.name, tags={key: works}, statuses=FINISHED_STATUSES)
        )
    ]
    ended = Counter(work for work, _ in runs)
    unclaimed = Counter(work for work, rescheduled in runs if not rescheduled)
    fresh = [b.with_retry(ended[b.work_key]) for b in batches]
    return fresh, [b for b in fresh if unclaimed[b.work_key] >= UNSTARTED_RUNS_LOUD]


@dg.sensor(
    job=reconcile_job,
    minimum_interval_seconds=sensor_interval_s(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Finds in-flight jobs past their provider kind's stale threshold and requests "
    "reconcile runs for them, one per job or packed per kind in a backlog. Writes nothing: each "
    "run takes the lease on its jobs when it starts.",
)
@timed_tick("stale_inflight_jobs_sensor")
def stale_inflight_jobs_sensor(
    context: dg.SensorEvaluationContext,
    database: DatabaseResource,
    reconcile_settings: ReconcileSettingsResource,
) -> dg.SensorResult | dg.SkipReason:
    """Scan, plan, request: reads the jobs table and the instance's runs, writes neither."""
    started = time.monotonic()
    now = time.time()
    since = read_cursor(context.cursor)
    if since is None:
        if context.cursor:
            context.log.warning(
                f"unreadable cursor {context.cursor!r}: outcomes are counted from this tick on"
            )
        since = now
    active = active_jobs(context.instance)
    busy = set(active)
    # Jobs waiting in queued runs are stale and unleased, so the scan returns them too: look past
    # them, or a deep queue would hide every job behind it.
    limit = min(reconcile_settings.scan_limit + len(busy), MAX_SCAN)
    modes = shadow_modes()
    try:
        engine = database.get_engine()
        with engine.connect() as conn:
            # Minus shadowed jobs decided within the cadence (RECON_MODE): shadow writes no job row.
            rows = scan_due(conn, limit, reconcile_settings.settings().cadence, modes=modes, cap=MAX_SCAN)
            previous = outcomes_since(conn, since)
    except DatabaseUnavailable as exc:
        return dg.SkipReason(f"database unavailable, nothing scanned: {exc}")

    scanned = [r for r in rows if r.id not in busy][: reconcile_settings.scan_limit]
    # A provider without its key is not configured: no run for the jobs it would have to poll
    # (they stay in flight, no attempt counted), one line per tick; every other provider goes on.
    scanned, unconfigured = without_unconfigured(scanned)
    for provider, n in sorted(unconfigured.items()):
        context.log.warning(f"{n} due job(s) not requested: {not_configured_line(provider)}")
    batch_sizes = batch_sizes_within_budgets(
        reconcile_settings.batch_size, reconcile_settings.concurrency, reconcile_settings.lease_seconds
    )
    batches = plan_batches(
        scanned,
        batch_size=reconcile_settings.batch_size,
        single_below=reconcile_settings.single_run_below,
        provider_batch_size=batch_sizes,
    )
    # Never more polls of a provider requested than its account serves in one cadence; the rest
    # wait their turn unleased (no attempt), whole batches at a time, fairly across kinds.
    batches, waiting = within_poll_budgets(
        batches,
        poll_budgets(reconcile_settings.settings().cadence.total_seconds()),
        Counter(p for p in active.values() if p is not None),
    )
    planned = {c.job_id for b in batches + waiting for c in b.claims}
    unroutable = [r for r in scanned if r.id not in planned]
    for row in unroutable:
        # A legacy row (no provider_kind) belongs to the sweep by design; an unknown kind is news.
        log = context.log.info if row.provider_kind is None else context.log.warning
        log(
            f"job {row.id}: provider_kind {row.provider_kind!r} has no reconcile partition; left to sync_sweep_job"
        )
    batches, stubborn = fresh_keys(context.instance, batches)
    for b in stubborn:
        if modes.shadowed(b.provider_kind):
            continue  # shadow runs leave no trace on their jobs: re-keyed every cadence by design
        context.log.error(
            f"runs of {b.work_key} ({len(b.claims)} job(s)) keep ending before they claim their jobs; "
            f"requesting it again as {b.run_key} (see those runs' errors)"
        )

    summary = Summary(scanned=len(scanned)).add_counts(previous)
    summary.elapsed_ms = int((time.monotonic() - started) * 1000)
    context.log.info(
        f"{summary.line()} requested={sum(len(b.claims) for b in batches)} runs={len(batches)} "
        f"inQueuedOrRunningRuns={len(busy)} leftToSweep={len(unroutable)}"
        + (f" waitingForPollBudget={_per_provider(waiting)}" if waiting else "")
    )
    if not batches:
        return dg.SensorResult(
            skip_reason=f"no stale job due: scanned={len(scanned)} (past threshold, not leased, not in a "
            f"queued or running run), leftToSweep={len(unroutable)}"
            + (f", waitingForPollBudget={_per_provider(waiting)}" if waiting else "")
            + "".join(
                f"; {n} due job(s) of {p} not requested: not configured"
                for p, n in sorted(unconfigured.items())
            )
            + f"; outcomes since last tick: {summary.line()}",
            cursor=write_cursor(now),
        )
    return dg.SensorResult(run_requests=[run_request_for(b) for b in batches], cursor=write_cursor(now))
