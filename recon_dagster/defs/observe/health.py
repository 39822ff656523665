"""Which provider is down, at a glance: ``provider_health`` with one check per provider.

A check is red while more than ``ERROR_RATE_LIMIT`` of its provider's recent reconcile attempts
errored (from ``ERROR_RATE_MIN_ATTEMPTS`` attempts on) and green otherwise, and its name is the
provider's, so the catalog and the asset's page say "replicate" rather than an error-rate key.
Every reconcile run refreshes the asset and the checks of the providers it polled, as soon as it
has recorded its attempts (not only at the health schedule's next pass), and ``provider_health_at_startup``
materializes it once when a deployment has never done so, so nothing says "Never materialized".
"""

from collections.abc import Iterable

import dagster as dg

from recon_dagster.core.kinds import KINDS, Provider
from recon_dagster.defs.observe.outcomes import (
    ERROR_RATE_LIMIT,
    ERROR_RATE_MIN_ATTEMPTS,
    RECENT_MINUTES,
    error_rates,
)
from recon_dagster.defs.resources import DatabaseResource

HEALTH = dg.AssetKey("provider_health")


def verdict(provider: str, attempts: int, errors: int) -> tuple[bool, str]:
    """(healthy, one line) for a provider's recent attempts (pure)."""
    rate = errors / attempts if attempts else 0.0
    if attempts < ERROR_RATE_MIN_ATTEMPTS:
        return True, f"{provider}: {attempts} attempt(s) in {RECENT_MINUTES} min, too few to judge"
    ok = rate <= ERROR_RATE_LIMIT
    state = "healthy" if ok else "DOWN"
    return (
        ok,
        f"{provider} {state}: {errors} of {attempts} attempts errored ({rate:.0%}) in {RECENT_MINUTES} min",
    )


def _evaluation(provider: str, attempts: int, errors: int) -> dg.AssetCheckEvaluation:
    ok, line = verdict(provider, attempts, errors)
    return dg.AssetCheckEvaluation(
        asset_key=HEALTH,
        check_name=provider,
        passed=ok,
        severity=dg.AssetCheckSeverity.ERROR,
        description=line,
        metadata={
            "attempts": attempts,
            "errors": errors,
            "error_rate": round(errors / attempts, 4) if attempts else 0.0,
        },
    )


def _metadata(rates: dict[str, tuple[int, int]]) -> dict:
    down = [p for p, (n, e) in sorted(rates.items()) if not verdict(p, n, e)[0]]
    meta: dict = {"down": ", ".join(down) or "none"}
    for p, (n, e) in sorted(rates.items()):
        meta[f"error_rate/{p}"] = round(e / n, 4) if n else 0.0
        meta[f"attempts/{p}"] = n
    return meta


def report_health(
    context: dg.OpExecutionContext, database: DatabaseResource, kinds: Iterable[str | None]
) -> None:
    """From a reconcile run that polled a provider: refresh provider_health and every provider's
    check. Every one, not only the polled ones: the console shows a check's result only for the
    asset's latest materialization, so a KIE run evaluating kie alone would turn a Replicate
    outage's red check into "Not evaluated"."""
    if not any(k in KINDS for k in kinds):
        return
    try:
        with database.get_engine().connect() as conn:
            rates = error_rates(conn)
    except Exception as exc:  # noqa: BLE001 - health figures must not fail a run that did its work
        context.log.warning(f"provider health could not be read: {exc}")
        return
    context.log_event(dg.AssetMaterialization(asset_key=HEALTH, metadata=_metadata(rates)))
    for p in Provider:
        # log_event takes a check evaluation at runtime (Dagster's own annotation lags behind it).
        context.log_event(_evaluation(p.value, *rates.get(p.value, (0, 0))))  # type: ignore[arg-type]


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            HEALTH,
            group_name="reconciliation",
            description=f"Each provider red or green: a check per provider fails while more than "
            f"{ERROR_RATE_LIMIT:.0%} of its reconcile attempts in the last {RECENT_MINUTES} minutes "
            "errored. Refreshed by every reconcile run and the health schedule.",
        )
    ],
    check_specs=[
        dg.AssetCheckSpec(p.value, asset=HEALTH, description=f"{p.value} answers reconcile polls")
        for p in Provider
    ],
)
def provider_health(context: dg.AssetExecutionContext, database: DatabaseResource):  # noqa: ANN201
    with database.get_engine().connect() as conn:
        rates = error_rates(conn)
    yield dg.MaterializeResult(asset_key=HEALTH, metadata=_metadata(rates))
    for p in Provider:
        ev = _evaluation(p.value, *rates.get(p.value, (0, 0)))
        yield dg.AssetCheckResult(
            asset_key=HEALTH,
            check_name=ev.check_name,
            passed=ev.passed,
            severity=ev.severity,
            description=ev.description,
            metadata=dict(ev.metadata),
        )


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
    "shows each provider's state from the first minute.",
)
def provider_health_at_startup(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    if context.instance.get_latest_materialization_event(HEALTH) is not None:
        return dg.SkipReason("provider_health has been materialized")
    # One key: Dagster launches it once; a failed first run is left to the health schedule.
    return dg.SensorResult(run_requests=[dg.RunRequest(run_key="provider-health-at-startup")])
