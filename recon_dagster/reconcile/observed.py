"""What the reconciler tells telemetry: an outcome's metrics and a job's span attributes (through
``recon_dagster.telemetry``'s API-only recorders: no settings read here, no-ops while it is off)."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.trace import Span

from recon_dagster.core.types import JobRow
from recon_dagster.db.jobs import Claim
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.outcome import JobOutcome
from recon_dagster.telemetry.instruments import FORCE_FAILS, OUTCOMES
from recon_dagster.telemetry.tracing import current_context, span

__all__ = ["claimed_events", "count_outcome", "current_context", "job_attributes", "span"]


def count_outcome(o: JobOutcome) -> None:
    """The outcome's metrics: one per job worked, and the force-fails at the cap."""
    OUTCOMES.add(1, kind=o.provider_kind, outcome=o.outcome.value)
    if o.outcome is Outcome.EXHAUSTED:
        FORCE_FAILS.add(1, kind=o.provider_kind)


def job_attributes(row: JobRow) -> dict[str, str | int]:
    """A job's span attributes (a trace may name the job; a metric label never does)."""
    return {
        "recon.job_id": str(row.id),
        "recon.provider_kind": row.provider_kind or "none",
        "recon.attempt": row.reconcile_attempts + 1,
    }


def claimed_events(claiming: Span | None, won: Sequence[Claim]) -> None:
    """One ``claimed`` event per job on the batch's claim span (nothing while tracing is off)."""
    if claiming is not None:
        for c in won:
            claiming.add_event("claimed", {"recon.job_id": str(c.job_id), "recon.attempt": c.attempt})
