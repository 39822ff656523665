"""Which provider is down, at a glance: ``provider_health`` with one check per provider.

A check fails while its provider is DOWN (``recon_dagster.operator.health``: most of the distinct
jobs polled in the window got no answer, from ``RECON_HEALTH_MIN_JOBS`` jobs on), passes while it
answers, and is left unevaluated while the provider is idle (no job of it polled in the window): a
provider nobody asked is neither red nor green. The check's name is the provider's, so the catalog
and the asset's page say "elevenlabs" rather than an error-rate key.

Every reconcile run re-evaluates the checks of every provider that is not idle as soon as it has
recorded its attempts (so an outage is red within the tick that saw it); the health schedule
materializes the asset (its table) and evaluates every check, a check of an idle provider showing
as skipped. ``provider_health_at_startup`` materializes it once when a deployment never did.

Why reconcile runs log check evaluations but no materialization: the console shows a check's
result only if Dagster counts it as one of the asset's latest materialization. A run that logged
a materialization and then its evaluations left every check "Not evaluated" in between (seconds
under load), and two runs doing so at once could leave them so until the next run. Evaluations
alone always count for the latest materialization (they are newer than it).
"""

from collections.abc import Iterable, Iterator
from typing import Any

import dagster as dg

from recon_dagster.config import Settings
from recon_dagster.core.kinds import KINDS, provider_names
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.operator.health import HealthPolicy, State, Verdict, verdicts

HEALTH = dg.AssetKey("provider_health")


def _evaluation(v: Verdict, policy: HealthPolicy) -> dg.AssetCheckEvaluation:
    f = v.figures
    return dg.AssetCheckEvaluation(
        asset_key=HEALTH,
        check_name=v.provider,
        passed=v.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=v.line,
        metadata={
            "state": v.state.value,
            "jobs": f.jobs,
            "jobs_without_answer": f.unanswered,
            "jobs_failed_by_their_own_result": f.own_errors,
            "window_s": policy.window_s,
            "last_reason": f.last_reason or "-",
            **{f"jobs/{k}": n for k, (n, _) in sorted(f.kinds.items())},
        },
    )


def _table(judged: list[Verdict]) -> str:
    lines = [
        "| provider | state | jobs polled | no answer | own bad result | last reason |",
        "|---|---|---:|---:|---:|---|",
    ]
    for v in judged:
        f = v.figures
        reason = (f.last_reason or "-").replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {v.provider} | {v.state.value.upper()} | {f.jobs} | {f.unanswered} | {f.own_errors} | {reason} |"
        )
    return "\n".join(lines)


def _metadata(judged: list[Verdict], policy: HealthPolicy) -> dict[str, Any]:
    def named(state: State) -> str:
        return ", ".join(v.provider for v in judged if v.state is state) or "none"

    meta: dict[str, Any] = {
        "down": named(State.DOWN),
        "healthy": named(State.HEALTHY),
        "idle": named(State.IDLE),
        "not_configured": named(State.NOT_CONFIGURED),
        "providers": dg.MetadataValue.md(_table(judged)),
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
    for v in judged:
        if v.state is not State.IDLE:
            # log_event takes a check evaluation at runtime (Dagster's own annotation lags behind it).
            context.log_event(_evaluation(v, policy))  # type: ignore[arg-type]


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            HEALTH,
            group_name="reconciliation",
            description="Each provider DOWN, healthy or idle, judged by its answers to reconcile polls "
            f"over the distinct jobs polled in the last {Settings.health_window_s.name} (30 min): a check per "
            "provider fails while most of them got no answer (5xx, 429, timeouts, refused connections; "
            f"from {Settings.health_min_jobs.name} jobs on). A job's own bad result never counts. An idle provider's "
            "check is skipped. The checks are re-evaluated by every reconcile run, this table by the "
            "health schedule.",
        )
    ],
    check_specs=[
        dg.AssetCheckSpec(
            p,
            asset=HEALTH,
            description=f"{p} answers reconcile polls (fails while it is DOWN; skipped while idle)",
        )
        for p in provider_names()
    ],
    # Checks are optional outputs: an idle provider's is not yielded, and shows as skipped.
    can_subset=True,
)
def provider_health(context: dg.AssetExecutionContext, database: DatabaseResource) -> Iterator[Any]:
    policy = HealthPolicy.from_config()
    with database.get_engine().connect() as conn:
        judged = verdicts(conn, policy)
    selected = context.selected_asset_check_keys
    # The evaluations first: in this run they count for the materialization that follows them.
    for v in judged:
        key = dg.AssetCheckKey(HEALTH, v.provider)
        if v.state is State.IDLE or key not in selected:
            continue
        ev = _evaluation(v, policy)
        yield dg.AssetCheckResult(
            asset_key=HEALTH,
            check_name=ev.check_name,
            passed=ev.passed,
            severity=ev.severity,
            description=ev.description,
            metadata=dict(ev.metadata),
        )
    if HEALTH in context.selected_asset_keys:
        context.log.info("; ".join(v.line for v in judged))
        yield dg.MaterializeResult(asset_key=HEALTH, metadata=_metadata(judged, policy))


provider_health_job = dg.define_asset_job(
    "provider_health_job",
    selection=dg.AssetSelection.assets(HEALTH),
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
