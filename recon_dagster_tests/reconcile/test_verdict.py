"""What a reconcile run says about itself (pure): it fails only when its provider
did not answer (or it failed inside), it never reads as plain green when it refunded at the cap,
and a job's own bad result is never an outage."""

from __future__ import annotations

import uuid

import pytest

from recon_dagster.reconcile.cause import Cause
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.outcome import JobOutcome
from recon_dagster.reconcile.verdict import (
    DEGRADED,
    INTERNAL_ERRORS,
    JOB_ERRORS,
    PROVIDER_OUTAGE,
    REFUNDED_AT_CAP,
    run_verdict,
)


def o(outcome: Outcome, cause: Cause | None, kind: str = "elevenlabs-async", detail: str = "x") -> JobOutcome:
    return JobOutcome(uuid.uuid4(), kind, outcome, 3, detail, 10, cause)


E, X = Outcome.ERROR, Outcome.EXHAUSTED
UNANSWERED = "poll failed: RetryableError: elevenlabs-async: HTTP 500: internal_error"


@pytest.mark.parametrize(
    ("outcomes", "tag", "fails"),
    [
        # An outage: nobody got an answer (a force-fail among them changes nothing).
        ([o(E, Cause.PROVIDER, detail=UNANSWERED)] * 3, PROVIDER_OUTAGE, True),
        ([o(E, Cause.PROVIDER), o(X, Cause.PROVIDER)], PROVIDER_OUTAGE, True),
        ([o(E, Cause.PROVIDER), o(Outcome.SKIPPED, Cause.NOT_ASKED)], PROVIDER_OUTAGE, True),
        ([o(E, Cause.PROVIDER), o(E, Cause.NOT_ASKED)], PROVIDER_OUTAGE, True),
        # The only job had its own bad result: never an outage, never a failed run.
        ([o(E, Cause.JOB, "kie-standard")], JOB_ERRORS, False),
        ([o(E, Cause.JOB, "kie-standard"), o(E, Cause.JOB, "kie-standard")], JOB_ERRORS, False),
        # One job's own bad result among unanswered ones: its provider answered it, so not an outage,
        # but half of the run got no answer: degraded.
        ([o(E, Cause.PROVIDER), o(E, Cause.JOB)], DEGRADED, False),
        # Ours.
        ([o(E, Cause.INTERNAL), o(E, None)], INTERNAL_ERRORS, True),
        ([o(E, Cause.INTERNAL), o(Outcome.RECOVERED, Cause.ANSWERED)], INTERNAL_ERRORS, False),
        # Money moved at the cap: a run that succeeded, never plain green.
        ([o(X, Cause.ANSWERED)], REFUNDED_AT_CAP, False),
        ([o(X, Cause.INTERNAL)], REFUNDED_AT_CAP, False),  # a takeover at the cap: settled, not failed
        ([o(X, Cause.JOB), o(Outcome.STILL_RUNNING, Cause.ANSWERED)], REFUNDED_AT_CAP, False),
        ([o(X, Cause.ANSWERED), o(E, Cause.JOB)], REFUNDED_AT_CAP, False),
        # Partial trouble with some progress: degraded from a fifth of the jobs without an answer.
        ([o(E, Cause.PROVIDER)] * 12 + [o(Outcome.STILL_RUNNING, Cause.ANSWERED)] * 2, DEGRADED, False),
        ([o(E, Cause.PROVIDER), o(Outcome.STILL_RUNNING, Cause.ANSWERED)], DEGRADED, False),
        ([o(E, Cause.PROVIDER)] + [o(Outcome.STILL_RUNNING, Cause.ANSWERED)] * 9, None, False),
        ([o(Outcome.RECOVERED, Cause.ANSWERED), o(Outcome.FAILED, Cause.ANSWERED)], None, False),
        ([], None, False),
        ([o(Outcome.SKIPPED, Cause.NOT_ASKED)], None, False),
    ],
)
def test_the_run_verdict(outcomes, tag, fails):
    verdict = run_verdict(outcomes)
    assert verdict.tag == tag
    assert (verdict.failure is not None) is fails


def test_an_outage_reason_is_one_line_naming_the_provider_and_the_last_reason():
    verdict = run_verdict(
        [o(E, Cause.PROVIDER, detail="a"), o(E, Cause.PROVIDER, "elevenlabs-async", UNANSWERED + "\nmore")]
    )
    assert verdict.failure == (
        "elevenlabs outage: none of the 2 job(s) of this run got an answer; each attempt was counted "
        f"(last: {UNANSWERED})"
    )
