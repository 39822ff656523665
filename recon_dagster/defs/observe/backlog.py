"""Observability in the Dagster UI: the in-flight backlog per provider kind as an asset, and
asset checks that fail loudly when credits leak or jobs stay stuck past every safety net."""

from typing import Any

import dagster as dg
import sqlalchemy as sa

from recon_dagster.core.kinds import (
    KINDS,
    LEGACY_STALE_THRESHOLD,
    MAX_ATTEMPTS,
    RECONCILE_CADENCE,
    precall_budget,
)
from recon_dagster.db.credits import valid_amount
from recon_dagster.db.jobs import inflight_counts
from recon_dagster.defs.observe.health import HEALTH
from recon_dagster.defs.observe.outcomes import HEALTH_ASSETS
from recon_dagster.defs.observe.stuck import STUCK
from recon_dagster.defs.resources import DatabaseResource

BACKLOG = dg.AssetKey("inflight_backlog")

# A reservation left on a terminal job this long is a leak, not a writer still finishing up.
LEAK_GRACE_MINUTES = 10


@dg.asset(
    key=BACKLOG,
    group_name="reconciliation",
    description="Jobs in flight per provider_kind: how many, how many past their stale threshold, "
    "how many leased by a reconcile run, and the highest reconcile_attempts (inflight/<kind> and "
    "stale/<kind> for every kind, zeros included).",
)
def inflight_backlog(
    context: dg.AssetExecutionContext, database: DatabaseResource
) -> dg.MaterializeResult[Any]:
    with database.get_engine().connect() as conn:
        rows = inflight_counts(conn)
    total = sum(r["inflight"] for r in rows)
    stale = sum(r["stale"] for r in rows)
    context.log.info(f"{total} job(s) in flight, {stale} past threshold")
    return dg.MaterializeResult(
        metadata={
            "inflight": total,
            "stale": stale,
            "by_kind": dg.MetadataValue.md(_table(rows)),
            **_per_kind(rows),
        }
    )


def _per_kind(rows: list[dict[str, Any]]) -> dict[str, int]:
    """``inflight/<kind>`` and ``stale/<kind>`` for every known kind, zeros included, every time,
    so each plot is a continuous series (rows of unknown or no kind add their own series)."""
    by_kind = {r["provider_kind"]: r for r in rows}
    out: dict[str, int] = {}
    for kind in sorted(set(KINDS) | set(by_kind)):
        r = by_kind.get(kind, {})
        out[f"inflight/{kind}"] = int(r.get("inflight", 0))
        out[f"stale/{kind}"] = int(r.get("stale", 0))
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "_no jobs in flight_"
    lines = ["| provider_kind | inflight | stale | leased | max attempts |", "|---|---:|---:|---:|---:|"]
    lines += [
        f"| {r['provider_kind']} | {r['inflight']} | {r['stale']} | {r['leased']} | {r['max_attempts'] or 0} |"
        for r in rows
    ]
    return "\n".join(lines)


# Starts from the reserved usage logs through their partial index (migration 138): the few
# reservations still open, never the whole, ever-growing usage_logs table.
CREDIT_LEAK_SQL = """
SELECT j.id, j.status, u.amount FROM usage_logs u JOIN jobs j ON j.id = u.job_id
WHERE u.status = 'reserved' AND j.status IN ('completed', 'failed', 'cancelled')
  AND j.updated_at < now() - make_interval(mins => :grace)
ORDER BY j.updated_at LIMIT 50
"""


@dg.asset_check(asset=BACKLOG, description="No terminal job still holds reserved credits.")
def no_credit_leak(database: DatabaseResource) -> dg.AssetCheckResult:
    with database.get_engine().connect() as conn:
        leaked = conn.execute(sa.text(CREDIT_LEAK_SQL), {"grace": LEAK_GRACE_MINUTES}).all()
    return dg.AssetCheckResult(
        passed=not leaked,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "leaked_jobs": len(leaked),
            "credits_held": float(sum(valid_amount(r.amount) or 0 for r in leaked)),
            "sample": dg.MetadataValue.json([{"job_id": str(r.id), "status": r.status} for r in leaked[:10]]),
        },
    )


def _give_up_after_minutes(kind_name: str | None) -> float:
    kind = KINDS.get(kind_name or "")
    threshold = kind.stale_threshold if kind else LEGACY_STALE_THRESHOLD
    return (threshold + RECONCILE_CADENCE * (MAX_ATTEMPTS + 2)).total_seconds() / 60


@dg.asset_check(
    asset=BACKLOG,
    description="No in-flight job has outlived its stale threshold plus the whole reconcile budget "
    "(MAX_ATTEMPTS at the cadence): such a job is one reconciliation is not reaching.",
)
def no_stuck_jobs(database: DatabaseResource) -> dg.AssetCheckResult:
    arms = " ".join(f"WHEN '{k}' THEN {_give_up_after_minutes(k)}" for k in KINDS)
    with database.get_engine().connect() as conn:
        stuck = conn.execute(
            sa.text(
                f"""
                SELECT id, provider_kind, reconcile_attempts, reconcile_last_error FROM jobs
                WHERE status IN ('pending', 'processing')
                  AND CASE WHEN provider_call_started_at IS NULL
                           -- not at its provider call yet: swept once the pre-call budget is spent
                           THEN COALESCE(started_at, created_at)
                                < now() - make_interval(secs => :precall_s)
                           ELSE provider_call_started_at
                                < now() - (CASE provider_kind {arms}
                                           ELSE {_give_up_after_minutes(None)} END) * interval '1 minute'
                      END
                LIMIT 50
                """
            ),
            {"precall_s": (precall_budget() + RECONCILE_CADENCE * 2).total_seconds()},
        ).all()
    return dg.AssetCheckResult(
        passed=not stuck,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "stuck_jobs": len(stuck),
            "sample": dg.MetadataValue.json(
                [
                    {
                        "job_id": str(r.id),
                        "provider_kind": r.provider_kind,
                        "attempts": r.reconcile_attempts,
                        "last_error": r.reconcile_last_error,
                    }
                    for r in stuck[:10]
                ]
            ),
        },
    )


reconcile_health_job = dg.define_asset_job(
    "reconcile_health_job",
    # provider_health's checks are its own evaluations, written after its materialization.
    selection=dg.AssetSelection.assets(BACKLOG, STUCK, HEALTH, *HEALTH_ASSETS)
    - dg.AssetSelection.checks_for_assets(HEALTH),
    executor_def=dg.in_process_executor,
    description="Refresh the in-flight backlog, credit anomalies and error rates per provider, and run "
    "their checks (credit leak, stuck jobs, new force-fails, error rate per provider).",
)

reconcile_health_schedule = dg.ScheduleDefinition(
    name="reconcile_health_schedule",
    job=reconcile_health_job,
    cron_schedule="*/5 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every 5 minutes: refresh the in-flight backlog and run the credit-leak and stuck-job checks.",
)
