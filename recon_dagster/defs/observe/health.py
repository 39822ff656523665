"""Which provider is down, at a glance: ``provider_health`` with one check per provider.

A check fails at ERROR severity while its provider is DOWN (``recon_dagster.operator.health``: most
of its distinct jobs in flight polled in the window got no answer, from ``RECON_HEALTH_MIN_JOBS``
jobs on), at WARN severity while it is DEGRADED (a fifth of them, from
``RECON_HEALTH_DEGRADED_MIN_JOBS``), passes while it answers, and is left unevaluated while the provider is idle (no job of it polled in the window): a
provider nobody asked is neither red nor green. The check's name is the provider's, so the catalog
and the asset's page say "elevenlabs" rather than an error-rate key.

Every reconcile run re-evaluates the checks of every provider that is not idle as soon as it has
recorded its attempts (so an outage is red within the tick that saw it); the health schedule
materializes the asset (its table) and evaluates every check of a provider that is not idle; an
idle provider's check is left as it was, unless it last failed: then it passes, its description
saying the provider is idle (nothing in flight is failing), which resolves the provider's incident. ``provider_health_at_startup`` materializes it once when a deployment never did.

The health run writes its evaluations after its materialization, each naming it
(``target_materialization_data``), and its jobs select the asset without its checks (a selected
check's evaluation would update a row planned at the run's start, older than any evaluation a
reconcile run logged meanwhile, and the console then read "Not evaluated" until the next one): a
DOWN provider's check never reads as anything but failed. While a provider is DOWN the run then
**fails** (its reason names the provider: red on the Runs page and the Overview timeline) and
carries ``recon/outcome=provider_outage`` with that provider, so the alert sensor counts the failure
into the provider's health incident rather than paging twice; while one is DEGRADED the run
succeeds tagged ``recon/outcome=degraded``.

Why reconcile runs log check evaluations but no materialization: the console shows a check's
result only if Dagster counts it as one of the asset's latest materialization. A run that logged
a materialization and then its evaluations left every check "Not evaluated" in between (seconds
under load), and two runs doing so at once could leave them so until the next run. Evaluations
alone always count for the latest materialization (they are newer than it).
"""

from collections.abc import Iterable, Iterator
from typing import Any

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from recon_dagster.config import Settings
from recon_dagster.core.kinds import KINDS, provider_names
from recon_dagster.core.runtags import OUTCOME_TAG, PROVIDER_TAG
from recon_dagster.defs.groups import ONCALL
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.operator.health import HealthPolicy, State, Verdict, slowness, verdicts
from recon_dagster.reconcile.verdict import DEGRADED, PROVIDER_OUTAGE

HEALTH = dg.AssetKey("provider_health")


def _latest_materialization(
    instance: dg.DagsterInstance,
) -> AssetCheckEvaluationTargetMaterializationData | None:
    """The asset's latest materialization, as the evaluations written now name it (the console
    counts an evaluation for the materialization it names)."""
    try:
        records = instance.fetch_materializations(HEALTH, limit=1).records
    except Exception:  # no target: Dagster falls back to the evaluation's time, newer than it
        return None
    if not records:
        return None
    r = records[0]
    return AssetCheckEvaluationTargetMaterializationData(
        storage_id=r.storage_id, run_id=r.run_id, timestamp=r.timestamp
    )


def _last_failed(instance: dg.DagsterInstance, provider: str) -> bool:
    """Did ``provider``'s check last fail (an idle provider's then passes: nothing in flight fails)?"""
    history = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(HEALTH, provider), limit=1
    )
    return bool(history) and history[0].status is AssetCheckExecutionRecordStatus.FAILED


def _evaluation(
    v: Verdict, policy: HealthPolicy, target: AssetCheckEvaluationTargetMaterializationData | None = None
) -> dg.AssetCheckEvaluation:
    f = v.figures
    return dg.AssetCheckEvaluation(
        target_materialization_data=target,
        asset_key=HEALTH,
        check_name=v.provider,
        passed=v.passed,
        severity=dg.AssetCheckSeverity.WARN if v.state is State.DEGRADED else dg.AssetCheckSeverity.ERROR,
        description=v.line,
        metadata={
            "state": v.state.value,
            "slow": slowness(f, policy) or "no",
            "poll_p90_s": round(f.slow_poll_ms / 1000, 1) if f.slow_poll_ms is not None else "-",
            "jobs": f.jobs,
            "jobs_without_answer": f.unanswered,
            "jobs_failed_by_their_own_result": f.own_errors,
            "window_s": policy.window_s,
            "last_reason": f.last_reason or "-",
            **{f"jobs/{k}": n for k, (n, _) in sorted(f.kinds.items())},
        },
    )


def _table(judged: list[Verdict], policy: HealthPolicy) -> str:
    lines = [
        "| provider | state | jobs in flight polled | no answer | own bad result | answers take (p90) "
        "| oldest in flight | last reason |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for v in judged:
        f = v.figures
        reason = (f.last_reason or "-").replace("|", "/").replace("\n", " ")
        p90 = f"{f.slow_poll_ms / 1000:.1f} s" if f.slow_poll_ms is not None else "-"
        if slowness(f, policy):
            p90 += " (slow)"
        oldest = f"{f.oldest_s / 60:.0f} min" if f.oldest_s is not None else "-"
        lines.append(
            f"| {v.provider} | {v.state.value.upper()} | {f.jobs} | {f.unanswered} | {f.own_errors} | {p90} "
            f"| {oldest} | {reason} |"
        )
    return "\n".join(lines)


def _metadata(judged: list[Verdict], policy: HealthPolicy) -> dict[str, Any]:
    def named(state: State) -> str:
        return ", ".join(v.provider for v in judged if v.state is state) or "none"

    meta: dict[str, Any] = {
        "down": named(State.DOWN),
        "degraded": named(State.DEGRADED),
        "healthy": named(State.HEALTHY),
        "idle": named(State.IDLE),
        "not_configured": named(State.NOT_CONFIGURED),
        "slow": ", ".join(v.provider for v in judged if slowness(v.figures, policy)) or "none",
        "providers": dg.MetadataValue.md(_table(judged, policy)),
        "window_s": policy.window_s,
    }
    for v in judged:
        meta[f"jobs/{v.provider}"] = v.figures.jobs
        meta[f"jobs_without_answer/{v.provider}"] = v.figures.unanswered
    return meta


def report_health(
    context: dg.OpExecutionContext, database: DatabaseResource, kinds: Iterable[str | None]
) -> None:
    """From a reconcile run that polled a provider: re-evaluate the check of every provider that
    is not idle (every one, not only the polled ones, so a recovering provider turns green with
    any run). Idle providers keep what the health schedule said of them."""
    if not any(k in KINDS for k in kinds):
        return
    policy = HealthPolicy.from_config()
    try:
        with database.get_engine().connect() as conn:
            judged = verdicts(conn, policy)
    except Exception as exc:  # health figures must not fail a run that did its work
        context.log.warning(f"provider health could not be read: {exc}")
        return
    target = _latest_materialization(context.instance)
    for v in judged:
        if v.state is not State.IDLE:
            # log_event takes a check evaluation at runtime (Dagster's own annotation lags behind it).
            context.log_event(_evaluation(v, policy, target))  # type: ignore[arg-type]


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            HEALTH,
            group_name=ONCALL,  # the Catalog's first group: what on-call opens first
            description="Each provider DOWN, DEGRADED, healthy or idle, judged by its answers to reconcile "
            f"polls over the distinct jobs polled in the last {Settings.health_window_s.name} (30 min), a job "
            "that ended only by an answer it got: a check per provider fails while most of them got no "
            f"answer (5xx, 429, timeouts, refused connections; from {Settings.health_min_jobs.name} jobs on), "
            f"at WARN while a fifth did ({Settings.health_degraded_share.name}). A job's own bad result never "
            "counts. Slow answers are shown per provider, never DOWN. The checks are re-evaluated by every "
            "reconcile run, this table by the health schedule, whose run fails while a provider is DOWN.",
        )
    ],
    check_specs=[
        dg.AssetCheckSpec(
            p,
            asset=HEALTH,
            description=f"{p} answers reconcile polls (fails while it is DOWN, at WARN while DEGRADED; "
            "not evaluated while idle)",
        )
        for p in provider_names()
    ],
    # Checks are optional outputs, written as evaluations after the materialization (see above).
    can_subset=True,
)
def provider_health(context: dg.AssetExecutionContext, database: DatabaseResource) -> Iterator[Any]:
    policy = HealthPolicy.from_config()
    with database.get_engine().connect() as conn:
        judged = verdicts(conn, policy)
    if HEALTH in context.selected_asset_keys:
        context.log.info("; ".join(v.line for v in judged))
        yield dg.MaterializeResult(asset_key=HEALTH, metadata=_metadata(judged, policy))
    # Then the evaluations, each written now (after the materialization, so newer than any a
    # reconcile run logged meanwhile) and naming the materialization it judges.
    target = _latest_materialization(context.instance)
    for v in judged:
        if v.state is not State.IDLE or _last_failed(context.instance, v.provider):
            # log_event takes a check evaluation at runtime (Dagster's own annotation lags behind it).
            context.log_event(_evaluation(v, policy, target))
    down = [v for v in judged if v.state is State.DOWN]
    degraded = [v for v in judged if v.state is State.DEGRADED]
    if down:
        _tag(context, {OUTCOME_TAG: PROVIDER_OUTAGE, PROVIDER_TAG: down[0].provider})
        raise dg.Failure(
            description="; ".join(v.line for v in down),
            metadata={"down": ", ".join(v.provider for v in down)},
            allow_retries=False,
        )
    if degraded:
        _tag(context, {OUTCOME_TAG: DEGRADED})


def _tag(context: dg.AssetExecutionContext, tags: dict[str, str]) -> None:
    """What the Runs page shows on the health run's row (a tag is a convenience: never fatal)."""
    try:
        context.instance.add_run_tags(context.run.run_id, tags)
    except Exception as exc:
        context.log.warning(f"could not tag this run with {tags}: {exc}")


# The health jobs select the asset without its checks: a selected check gets a "planned" row at the
# run's start, and its evaluation updates that older row, which then loses to any evaluation a
# reconcile run logged meanwhile (the console then reads "Not evaluated" until the next one).
HEALTH_WITHOUT_CHECKS = dg.AssetSelection.assets(HEALTH).without_checks()

provider_health_job = dg.define_asset_job(
    "provider_health_job",
    selection=HEALTH_WITHOUT_CHECKS,
    executor_def=dg.in_process_executor,
    description="Refresh provider_health and its check per provider.",
)


@dg.sensor(
    job=provider_health_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="At startup: materialize provider_health once if it never was, so the console "
    "shows each provider's state from the first minute (again after a failed run, until one succeeds).",
)
def provider_health_at_startup(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    if context.instance.get_latest_materialization_event(HEALTH) is not None:
        return dg.SkipReason("provider_health has been materialized")
    runs = context.instance.get_runs(filters=dg.RunsFilter(job_name=provider_health_job.name))
    if any(r.status not in _ENDED for r in runs):
        return dg.SkipReason("a provider_health_job run is under way")
    # Until one succeeds, each ended run gets a successor under a fresh key (Dagster never launches
    # a key twice): its success is what resolves the incident the failed first run opened.
    ended = sum(r.status in _ENDED for r in runs)
    key = STARTUP_KEY if not ended else f"{STARTUP_KEY}~{ended}"
    return dg.SensorResult(run_requests=[dg.RunRequest(run_key=key)])


STARTUP_KEY = "provider-health-at-startup"
_ENDED = frozenset({dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED})
