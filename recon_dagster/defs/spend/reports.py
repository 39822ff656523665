"""How a spend report shows in Dagster: the asset's metadata (numbers Dagster plots per partition)
and its check's result, which names the tasks, requests or jobs behind the difference."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import dagster as dg

from recon_dagster.reconcile.spend import SpendReport
from recon_dagster.telemetry.instruments import SPEND_DIFFERENCE

GROUP = "spend"
CHECK = "bill_matches_our_charges"
# The first day the spend assets reconcile (a backfill may start here).
FIRST_DAY = "2026-01-01"
daily = dg.DailyPartitionsDefinition(start_date=FIRST_DAY, timezone="UTC")


def window(context: dg.AssetExecutionContext) -> tuple[datetime, datetime]:
    """The partition's day, ``[start, end)`` in UTC."""
    tw = context.partition_time_window
    return tw.start.astimezone(UTC), tw.end.astimezone(UTC)


def figures(report: SpendReport) -> dict[str, Any]:
    """The numbers of a report, as the summary and the plots read them (floats and ints only)."""
    counts: dict[str, int] = {}
    for f in report.findings:
        counts[f.what] = counts.get(f.what, 0) + 1
    meta: dict[str, Any] = {
        "provider_amount": dg.MetadataValue.float(float(report.provider_amount)),
        "our_amount": dg.MetadataValue.float(float(report.our_amount)),
        "difference": dg.MetadataValue.float(float(report.judged_difference)),
        "tolerance": dg.MetadataValue.float(float(report.tolerance)),
        "our_cost_usd": dg.MetadataValue.float(float(report.our_cost_usd)),
        "findings": dg.MetadataValue.int(len(report.findings)),
        **{f"findings/{what}": dg.MetadataValue.int(n) for what, n in sorted(counts.items())},
        **{f"breakdown/{k}": dg.MetadataValue.float(float(v)) for k, v in report.breakdown.items()},
    }
    return meta


def result(report: SpendReport, extra: dict[str, Any] | None = None) -> dg.MaterializeResult[Any]:
    """The asset's materialization with its check's evaluation."""
    if report.configured:
        SPEND_DIFFERENCE.record(float(report.judged_difference), provider=report.provider, unit=report.unit)
    meta: dict[str, Any] = {
        **figures(report),
        "unit": report.unit,
        "final": report.final,
        "configured": report.configured,
        "summary": report.line(),
        "named": dg.MetadataValue.json(report.named()),
        **(extra or {}),
    }
    if report.note:
        meta["note"] = report.note
    check = dg.AssetCheckResult(
        check_name=CHECK,
        passed=report.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=report.line(),
        metadata={
            "difference": dg.MetadataValue.float(float(report.judged_difference)),
            "tolerance": dg.MetadataValue.float(float(report.tolerance)),
            "unit": report.unit,
            "final": report.final,
            "configured": report.configured,
            "named": dg.MetadataValue.json(report.named()),
        },
    )
    return dg.MaterializeResult(metadata=meta, check_results=[check])


def check_spec(key: dg.AssetKey, unit: str, setting: str) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        name=CHECK,
        asset=key,
        description=f"Fails when the provider's bill of the day differs from our charges by more than "
        f"{setting} ({unit}), once the provider's report is final; names the tasks, requests or jobs "
        "behind the difference (docs/operations.md, spend reconciliation).",
    )


def now() -> datetime:
    return datetime.now(UTC)
