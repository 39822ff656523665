"""Whose fault an attempt's end was, and what provider health makes of it (pure).

A provider is judged by how it answered polls; a job's own bad result and our own errors never
count against it, and an outcome that represents no exchange with the provider counts as nothing.
"""

from __future__ import annotations

import uuid

import pytest

from recon_dagster.media.errors import MediaExpired, MediaUnusable
from recon_dagster.providers.base import ProviderConfigError
from recon_dagster.providers.http import RetryableError
from recon_dagster.providers.kie.parse import KieEnvelopeError
from recon_dagster.providers.limits import AccountBusy, TokenWaitTooLong
from recon_dagster.providers.status import ProviderHTTPError, ProviderProtocolError
from recon_dagster.reconcile.cause import (
    HEALTH_BY_CAUSE,
    HEALTH_BY_OUTCOME,
    Cause,
    finalize_error_cause,
    health_pairs,
    health_signal,
    poll_error_cause,
)
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.finalize import ForeignTaskResult, UnusableResult


def test_every_outcome_and_every_cause_has_one_line_in_the_classification():
    """A new outcome (say, a poll this process never sent) must say whether it counts: this fails
    until it has its line."""
    assert set(HEALTH_BY_OUTCOME) == set(Outcome)
    assert set(HEALTH_BY_CAUSE) == set(Cause)


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (ProviderHTTPError("kie-standard", 500, "Internal Server Error"), Cause.PROVIDER),
        (ProviderHTTPError("replicate-prediction", 503, "busy"), Cause.PROVIDER),
        (RetryableError("elevenlabs-async", 429, "slow down", 2.0), Cause.PROVIDER),
        (
            ProviderHTTPError("kie-veo", None, "GET /x: no answer within the 30 s read timeout"),
            Cause.PROVIDER,
        ),
        (
            ProviderHTTPError("kie-veo", None, "GET /x: ConnectError: [Errno 111] Connection refused"),
            Cause.PROVIDER,
        ),
        (ProviderHTTPError("replicate-training", 401, "Unauthenticated"), Cause.PROVIDER),
        (ProviderHTTPError("replicate-training", 403, "forbidden"), Cause.PROVIDER),
        (ProviderHTTPError("kie-standard", 404, "<html>404 page</html>"), Cause.PROVIDER),
        (KieEnvelopeError("kie-standard", 401, "Unauthorized"), Cause.PROVIDER),
        (KieEnvelopeError("kie-standard", 402, "insufficient credits"), Cause.PROVIDER),
        (ProviderConfigError("kie: environment variable KIE_API_KEY is not set"), Cause.PROVIDER),
        # The job's own: one request's answer that cannot be used.
        (ProviderHTTPError("kie-standard", 400, "taskId malformed"), Cause.JOB),
        (ProviderHTTPError("replicate-prediction", 422, "invalid id"), Cause.JOB),
        (ProviderProtocolError("kie-standard", "data.state 'weird' is not a state we know"), Cause.JOB),
        (KieEnvelopeError("kie-standard", 422, "record is invalid"), Cause.JOB),
        # Nothing was sent: the account's own budget refused it.
        (TokenWaitTooLong("kie-standard", None, "next token after the deadline"), Cause.NOT_ASKED),
        (AccountBusy("kie-standard", "no kie slot free for 30 s"), Cause.NOT_ASKED),
        # Ours.
        (RuntimeError("bug"), Cause.INTERNAL),
        (ValueError("bad row"), Cause.INTERNAL),
    ],
)
def test_a_failed_poll_is_blamed_on_whoever_failed(exc, cause):
    assert poll_error_cause(exc) is cause


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (UnusableResult(uuid.uuid4(), "kie-standard", "text/plain, 52 bytes"), Cause.JOB),
        (ForeignTaskResult(uuid.uuid4(), "kie-standard", "t1", "t2"), Cause.JOB),
        (MediaExpired("https://cdn.example/x.png?sig=1", 403), Cause.JOB),
        (MediaUnusable("https://cdn.example/x.png", "empty"), Cause.JOB),
        (ProviderHTTPError("elevenlabs-async", 500, "audio fetch failed"), Cause.PROVIDER),
        (RuntimeError("database went away"), Cause.INTERNAL),
    ],
)
def test_a_success_that_could_not_be_completed_is_the_jobs_unless_the_provider_or_we_failed(exc, cause):
    assert finalize_error_cause(exc) is cause


@pytest.mark.parametrize(
    ("outcome", "cause", "signal"),
    [
        (Outcome.STILL_RUNNING, Cause.ANSWERED, True),
        (Outcome.RECOVERED, Cause.ANSWERED, True),
        (Outcome.FAILED, Cause.ANSWERED, True),
        (Outcome.ERROR, Cause.PROVIDER, False),
        (Outcome.EXHAUSTED, Cause.PROVIDER, False),
        (Outcome.EXHAUSTED, Cause.ANSWERED, True),  # ran out of attempts while upstream kept running
        (Outcome.ERROR, Cause.JOB, None),
        (Outcome.EXHAUSTED, Cause.JOB, None),
        (Outcome.ERROR, Cause.INTERNAL, None),
        (Outcome.ERROR, Cause.NOT_ASKED, None),
        (Outcome.SWEPT, Cause.NOT_ASKED, None),
        (Outcome.SKIPPED, Cause.NOT_ASKED, None),
        (Outcome.LOST_RACE, Cause.ANSWERED, None),
        (Outcome.ERROR, None, None),  # a row written before causes were recorded
        ("operator_fail", None, None),
        ("a_future_outcome", Cause.PROVIDER, None),
    ],
)
def test_health_reads_only_the_providers_answers(outcome, cause, signal):
    assert health_signal(outcome, cause) is signal


def test_the_sql_pairs_are_the_table():
    pairs = {(o, c): a for o, c, a in health_pairs()}
    for outcome in Outcome:
        for cause in Cause:
            assert pairs.get((outcome.value, cause.value)) == health_signal(outcome, cause)
