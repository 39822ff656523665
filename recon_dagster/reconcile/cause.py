"""Whose fault an attempt's end was: the provider's, the job's own, ours, or nobody's (pure).

Provider health and the run's outage verdict read only this. A provider is judged by how it
answered polls (an answer of any state, or a 5xx / 429 / timeout / refused connection / wrong
key); a job's own bad result (media that is not what was promised, another task's result, an
answer that cannot be read for that one job) is that job's problem and never the provider's, and
what we did ourselves (a settle that raised, a bad row) is neither.

``HEALTH_BY_OUTCOME`` and ``HEALTH_BY_CAUSE`` are the whole classification, one line per outcome
and per cause: an outcome that never represents an exchange with the provider (e.g. a poll this
process never sent) is one more ``False`` line, and a test fails until every outcome has one.
"""

from __future__ import annotations

from enum import StrEnum

import sqlalchemy as sa

from recon_dagster.db.engine import DatabaseUnavailable
from recon_dagster.media.errors import MediaError
from recon_dagster.providers.base import ProviderConfigError
from recon_dagster.providers.status import NotSent, ProviderHTTPError, ProviderProtocolError
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.finalize import UnusableResult


class Cause(StrEnum):
    """Why an attempt ended as it did (``reconcile_events.cause``, migration 147)."""

    ANSWERED = "answered"  # the provider answered the poll (running, succeeded, failed, not found...)
    PROVIDER = "provider"  # it did not answer usefully: 5xx, 429, timeout, refused, reset, rejected key
    JOB = "job"  # this job's own result: unusable media, another task's result, an unreadable answer
    INTERNAL = "internal"  # ours: a settle that raised, a bad counter or timestamp, the database
    NOT_ASKED = "not_asked"  # nothing was asked of the provider (sweep, claim, lease lost, not sent)


# Does an outcome of this kind say anything about its provider at all? (then its cause decides)
HEALTH_BY_OUTCOME: dict[Outcome, bool] = {
    Outcome.RECOVERED: True,
    Outcome.FAILED: True,
    Outcome.STILL_RUNNING: True,
    Outcome.ERROR: True,
    Outcome.EXHAUSTED: True,
    Outcome.SWEPT: False,  # nothing to poll: a sync call or a row without a task
    Outcome.LOST_RACE: False,  # another writer settled the job first
    Outcome.SKIPPED: False,  # not worked by this run
    Outcome.NOT_SENT: False,  # this process never sent the poll (its own limiter refused it)
    Outcome.OUR_FAULT: False,  # our configuration, storage or database stopped it, not the provider
}

# How a cause reads in provider health: True an answer, False no answer, None not the provider's.
HEALTH_BY_CAUSE: dict[Cause, bool | None] = {
    Cause.ANSWERED: True,
    Cause.PROVIDER: False,
    Cause.JOB: None,
    Cause.INTERNAL: None,
    Cause.NOT_ASKED: None,
}


def health_signal(outcome: Outcome | str, cause: Cause | str | None) -> bool | None:
    """True: the provider answered; False: it did not; None: the attempt says nothing about it."""
    try:
        counted = HEALTH_BY_OUTCOME[Outcome(outcome)]
    except (ValueError, KeyError):
        return None  # an operator action, or an outcome this version does not know
    if not counted or cause is None:
        return None
    try:
        return HEALTH_BY_CAUSE[Cause(cause)]
    except ValueError:
        return None


def health_pairs() -> tuple[tuple[str, str, bool], ...]:
    """Every (outcome, cause, answered) that counts in provider health, for SQL."""
    return tuple(
        (outcome.value, cause.value, answered)
        for outcome, counted in HEALTH_BY_OUTCOME.items()
        if counted
        for cause, answered in HEALTH_BY_CAUSE.items()
        if answered is not None
    )


class OurFault(StrEnum):
    """A failure of ours that stopped an attempt (``Outcome.OUR_FAULT``): never the job's, so it
    costs the job no attempt and never leads to a refund; loud on our own health check instead."""

    CONFIGURATION = "our_configuration"  # a provider key missing or refused, a wrong resource
    STORAGE = "our_storage"  # our media store refused the write (permissions, disk full, bucket)
    DATABASE = "our_database"  # the app's database dropped or refused us mid-attempt (a blip)


# An answer that refuses our credentials (or our egress proxy's): the key is ours to fix.
_OUR_AUTH_STATUSES = frozenset({401, 403, 407})


def our_fault(exc: BaseException) -> OurFault | None:
    """The fault of ours behind ``exc``, or None when it is the provider's, the job's, or a bug
    (a bug still counts the attempt, so a row that breaks us every time ends at the cap)."""
    if isinstance(exc, NotSent):
        return None  # its own outcome: never sent
    if isinstance(exc, ProviderConfigError):
        return OurFault.CONFIGURATION
    if isinstance(exc, ProviderHTTPError) and exc.status_code in _OUR_AUTH_STATUSES:
        return OurFault.CONFIGURATION
    if isinstance(exc, ProviderProtocolError) and getattr(exc, "code", None) in _OUR_AUTH_STATUSES:
        return OurFault.CONFIGURATION  # KIE's 401 inside an HTTP 200
    if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError | DatabaseUnavailable):
        return OurFault.DATABASE  # connection lost, server restarting, too many clients
    if isinstance(exc, MediaError | UnusableResult):
        return None  # the job's own media
    if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("botocore", "boto3"):
        return OurFault.STORAGE  # a folder we cannot write, a full disk, a bucket that refuses us
    return None


# HTTP statuses that mean the provider as a whole is not answering us usefully: authentication,
# a wrong path (a 404 page that is not the provider's own "not found"), rate limits and server
# errors. Other 4xx answers concern the one request (a malformed task id, a gone object).
_PROVIDER_STATUSES = frozenset({401, 403, 404, 405, 407, 408, 429})


def poll_error_cause(exc: BaseException) -> Cause:
    """The cause of a poll that raised instead of answering."""
    if isinstance(exc, NotSent):
        return Cause.NOT_ASKED  # our own limiter or breaker refused it before anything was sent
    if isinstance(exc, ProviderConfigError):
        return Cause.PROVIDER  # no key or a wrong resource: no job of that provider can be asked
    if isinstance(exc, ProviderHTTPError):
        code = exc.status_code
        if code is None or code >= 500 or code in _PROVIDER_STATUSES:
            return Cause.PROVIDER  # a transport failure (timeout, refused, reset) or a provider-wide status
        return Cause.JOB
    if isinstance(exc, ProviderProtocolError):
        # An envelope code (KIE's 401/402/429 inside HTTP 200) speaks for the account; any other
        # answer we cannot read is that job's.
        code = getattr(exc, "code", None)
        if isinstance(code, int) and (code >= 500 or code in _PROVIDER_STATUSES or code == 402):
            return Cause.PROVIDER
        return Cause.JOB
    return Cause.INTERNAL


def finalize_error_cause(exc: BaseException) -> Cause:
    """The cause of a success that could not be completed: the job's own result (its media, its
    task) unless the failure was ours (a database error, a bug)."""
    if isinstance(exc, UnusableResult | MediaError):
        return Cause.JOB
    if isinstance(exc, ProviderHTTPError | ProviderProtocolError | ProviderConfigError):
        return poll_error_cause(exc)  # media fetched from the provider's own API (ElevenLabs audio)
    return Cause.INTERNAL
