"""Severity follows the money: what a reconcile run must not report as a quiet green success.

A job force-failed at the attempt cap (refunded without ever learning what upstream did) and a
settle step that raised (a reservation left open) are each logged at WARNING with the job id,
and the run reports a failed evaluation of a check on ``credit_anomalies`` itself, so the asset
turns red at once instead of at the health schedule's next pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dagster as dg

from recon_dagster.defs.observe.outcomes import (
    ANOMALIES,
    RECENT_MINUTES,
    exhausted_window,
    recent_anomalies_check,
)
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.reconciler import JobOutcome

EXHAUSTED_CHECK = "no_new_exhausted_jobs"
SETTLE_CHECK = "no_settle_errors"
# The reconciler's details of an attempt whose fail / refund / force-fail raised.
SETTLE_MARKS = ("settle step ", "force_fail raised ")


def is_settle_error(o: JobOutcome) -> bool:
    return o.outcome is Outcome.ERROR and any(m in o.detail for m in SETTLE_MARKS)


def _sample(outcomes: Sequence[JobOutcome]) -> dg.MetadataValue:
    return dg.MetadataValue.json(
        [
            {"job_id": str(o.job_id), "provider_kind": o.provider_kind, "detail": o.detail[:300]}
            for o in outcomes[:10]
        ]
    )


def flag_money(
    context: dg.OpExecutionContext, outcomes: Sequence[JobOutcome], database: DatabaseResource | None = None
) -> None:
    """WARNING lines and failed check evaluations for this run's force-fails and settle errors."""
    for check, label, hits in (
        (
            EXHAUSTED_CHECK,
            "force-failed at the attempt cap and refunded",
            [o for o in outcomes if o.outcome is Outcome.EXHAUSTED],
        ),
        (SETTLE_CHECK, "left unsettled: the settle step raised", [o for o in outcomes if is_settle_error(o)]),
    ):
        if not hits:
            continue
        ids = ", ".join(str(o.job_id) for o in hits[:20]) + (
            f" (+{len(hits) - 20} more)" if len(hits) > 20 else ""
        )
        context.log.warning(f"{len(hits)} job(s) {label}: {ids}")
        description = f"{len(hits)} job(s) {label} by run {context.run_id}"
        window: dict[str, Any] = {}
        if check == EXHAUSTED_CHECK and database is not None:
            # The check counts its window, not this run: the alert tells the running count and kinds.
            try:
                with database.get_engine().connect() as conn:
                    seen = exhausted_window(conn)
                description, window = f"{seen.line}; {len(hits)} by run {context.run_id}", seen.metadata()
            except Exception as exc:  # the figures must not fail a run that did its work
                context.log.warning(f"force-fails of the window could not be read: {exc}")
        # log_event takes a check evaluation at runtime (Dagster's own annotation lags behind it).
        context.log_event(
            dg.AssetCheckEvaluation(  # type: ignore[arg-type]
                asset_key=ANOMALIES,
                check_name=check,
                passed=False,
                severity=dg.AssetCheckSeverity.ERROR,
                description=description,
                metadata={**window, "jobs": len(hits), "run_id": context.run_id, "sample": _sample(hits)},
            )
        )


@dg.asset_check(
    asset=ANOMALIES,
    name=SETTLE_CHECK,
    description=f"No settle step (fail, refund, force-fail) raised in the last {RECENT_MINUTES} minutes: "
    "each such job still holds its reservation until a later attempt settles it.",
)
def no_settle_errors(database: DatabaseResource) -> dg.AssetCheckResult:
    return recent_anomalies_check(database, "reconcile_settle_error", "settle_errors")
