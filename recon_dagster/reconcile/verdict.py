"""What a reconcile run says about itself on the Runs page (pure): failed or not, and its outcome tag.

- A run fails when none of its jobs got anywhere because **their provider did not answer** (an
  outage: 5xx, 429, timeouts, refused connections; the attempts are counted), or because every one
  failed inside reconciliation itself (a settle that raised, the database). Its one-line reason
  names the provider and the last reason, and ``recon/outcome`` says which of the two it was.
- A run that **moved money at the cap** (force-failed and refunded a job at its last attempt,
  never learning what upstream did) succeeds, since it did its work, but is never a plain green
  success: it carries ``recon/outcome=refunded_at_cap``, visible on its row and filterable.
- A run in which **some of its jobs got no answer** (at least ``degraded_share`` of the jobs it
  worked, not all of them) succeeds, since the others were worked, but carries
  ``recon/outcome=degraded``: a provider answering only part of the time shows on the Runs page.
- A job's **own bad result** (media that is not what was promised, another task's result, an
  answer unreadable for that job) never fails its run and never reads as an outage: the run carries
  ``recon/outcome=job_errors`` and the job says why in its log line, ``explain`` and ``stuck_jobs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recon_dagster.core.kinds import KINDS
from recon_dagster.core.text import short_reason
from recon_dagster.reconcile.cause import Cause
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.outcome import JobOutcome

PROVIDER_OUTAGE = "provider_outage"
INTERNAL_ERRORS = "internal_errors"
REFUNDED_AT_CAP = "refunded_at_cap"
JOB_ERRORS = "job_errors"
DEGRADED = "degraded"
# Every value ``recon/outcome`` takes, the most serious first.
RUN_OUTCOMES = (PROVIDER_OUTAGE, INTERNAL_ERRORS, REFUNDED_AT_CAP, DEGRADED, JOB_ERRORS)

_STOPPED = (Outcome.ERROR, Outcome.EXHAUSTED)  # the attempt ended without settling the job
# Not worked by this run, or (NOT_SENT) never sent to the provider: no attempt, so it neither shows
# an outage nor hides one.
_NOT_WORKED = (Outcome.SKIPPED, Outcome.LOST_RACE, Outcome.NOT_SENT)


@dataclass(frozen=True)
class RunVerdict:
    """``tag``: the value of ``recon/outcome`` (None: nothing to flag); ``failure``: the run's
    one-line failure reason (None: the run succeeds)."""

    tag: str | None
    failure: str | None = None
    jobs: int = 0
    sample: tuple[str, ...] = ()


def _providers(outcomes: Sequence[JobOutcome]) -> str:
    names = sorted({KINDS[k].provider for o in outcomes if (k := o.provider_kind) is not None and k in KINDS})
    return ", ".join(names) or "the provider"


def _first_line(detail: str, limit: int = 300) -> str:
    return short_reason(detail.strip().splitlines()[0] if detail.strip() else "", limit)


def run_verdict(outcomes: Sequence[JobOutcome], degraded_share: float = 0.2) -> RunVerdict:
    """The verdict on one run's outcomes (claim-time, finalize, fail and count steps together);
    ``degraded_share``: the share of its worked jobs without an answer from which it is degraded."""
    worked = [o for o in outcomes if o.outcome not in _NOT_WORKED]
    sample = tuple(_first_line(o.detail) for o in worked[:5] if o.detail)
    ours = [o for o in worked if o.outcome is Outcome.OUR_FAULT]
    if ours and len(ours) == len(worked):
        # Loud, as an outage is, but honest: nothing was charged to the jobs.
        return RunVerdict(
            INTERNAL_ERRORS,
            f"every job of this run ({len(worked)}) was stopped by a fault of ours, not the job's: no "
            f"attempt counted, nothing refunded, each due again after a cadence (last: {_first_line(ours[-1].detail)})",
            len(worked),
            sample,
        )
    stopped = [o for o in worked if o.outcome in _STOPPED]
    # At least one attempt errored: a run whose jobs were all force-failed at the cap settled them.
    if worked and len(stopped) == len(worked) and any(o.outcome is Outcome.ERROR for o in stopped):
        unanswered = [o for o in stopped if o.cause is Cause.PROVIDER]
        ours = [o for o in stopped if o.cause in (Cause.INTERNAL, None)]
        unsent = [o for o in stopped if o.cause is Cause.NOT_ASKED]  # neither side's failure
        if unanswered and len(unanswered) + len(ours) + len(unsent) == len(worked):
            last = _first_line(unanswered[-1].detail)
            return RunVerdict(
                PROVIDER_OUTAGE,
                f"{_providers(unanswered)} outage: none of the {len(worked)} job(s) of this run got an "
                f"answer; each attempt was counted (last: {last})",
                len(worked),
                sample,
            )
        if ours and len(ours) == len(worked):
            return RunVerdict(
                INTERNAL_ERRORS,
                f"every job of this run ({len(worked)}) failed inside reconciliation; each attempt was "
                f"counted (last: {_first_line(ours[-1].detail)})",
                len(worked),
                sample,
            )
    if any(o.outcome is Outcome.EXHAUSTED for o in worked):
        return RunVerdict(REFUNDED_AT_CAP, jobs=len(worked), sample=sample)
    if ours:
        return RunVerdict(INTERNAL_ERRORS, jobs=len(worked), sample=sample)
    if any(o.outcome in _STOPPED and o.cause in (Cause.INTERNAL, None) for o in worked):
        return RunVerdict(INTERNAL_ERRORS, jobs=len(worked), sample=sample)
    unanswered = [o for o in worked if o.outcome in _STOPPED and o.cause is Cause.PROVIDER]
    if unanswered and len(unanswered) >= degraded_share * len(worked):
        return RunVerdict(
            DEGRADED,
            jobs=len(worked),
            sample=tuple(_first_line(o.detail) for o in unanswered[:5] if o.detail),
        )
    if any(o.outcome in _STOPPED and o.cause is Cause.JOB for o in worked):
        return RunVerdict(JOB_ERRORS, jobs=len(worked), sample=sample)
    return RunVerdict(None, jobs=len(worked), sample=sample)
