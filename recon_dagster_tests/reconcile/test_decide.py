"""The pure reconcile decisions (recon_dagster.reconcile.decide): routing, the answer to each
upstream state, and every boundary of the attempt cap. No database, no I/O."""

from __future__ import annotations

from dataclasses import replace

import pytest

from recon_dagster.core.kinds import KINDS, MAX_ATTEMPTS
from recon_dagster.providers.status import UpstreamState, UpstreamStatus
from recon_dagster.reconcile.decide import (
    Action,
    Decision,
    Route,
    decide_after_attempt,
    decide_on_status,
    failure_message,
    route,
)
from recon_dagster_tests.support.factories import unsaved_job_row as row

ASYNC_KINDS = sorted(k.name for k in KINDS.values() if k.is_async)
SYNC_KINDS = sorted(k.name for k in KINDS.values() if not k.is_async)


def status(state: UpstreamState, error: str | None = None) -> UpstreamStatus:
    return UpstreamStatus(provider_kind="kie-standard", task_id="t-1", state=state, error=error)


# --- routing ------------------------------------------------------------------------------------


def test_the_registry_has_both_sync_and_async_kinds() -> None:
    # The parametrized tests below would pass vacuously over an empty list.
    assert ASYNC_KINDS and SYNC_KINDS


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_an_async_kind_with_a_task_id_is_polled(kind: str) -> None:
    assert route(row(kind, "task-1")) is Route.POLL


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_a_sync_kind_is_swept_even_with_a_task_id(kind: str) -> None:
    # A sync call has nothing upstream to ask about, whatever the row carries.
    assert route(row(kind, "task-1")) is Route.SWEEP


@pytest.mark.parametrize("kind", ASYNC_KINDS)
@pytest.mark.parametrize("task_id", [None, ""])
def test_an_async_kind_without_a_usable_task_id_is_swept(kind: str, task_id: str | None) -> None:
    assert route(row(kind, task_id)) is Route.SWEEP


@pytest.mark.parametrize("kind", [None, "", "no-such-kind"])
def test_a_missing_or_unknown_kind_is_swept(kind: str | None) -> None:
    assert route(row(kind, "task-1")) is Route.SWEEP


def test_routing_reads_only_kind_and_task_id() -> None:
    base = row("kie-standard", "task-1")
    assert route(replace(base, reconcile_attempts=MAX_ATTEMPTS + 5, status="pending")) is Route.POLL


# --- the answer to each upstream state ------------------------------------------------------------


# The reason becomes the job's error_message (``failure_message``) or its reconcile_last_error,
# which operators and the app read: each one is pinned word for word.
EXPECTED = {
    UpstreamState.SUCCEEDED: (Action.FINALIZE, "upstream succeeded"),
    UpstreamState.RUNNING: (Action.RETRY_LATER, "upstream still running"),
    UpstreamState.FAILED: (Action.FAIL, "upstream failed: no message"),
    UpstreamState.NOT_FOUND: (Action.FAIL, "upstream task not found"),
    UpstreamState.EXPIRED: (Action.FAIL, "upstream result expired before it was collected"),
}


def test_every_state_is_decided() -> None:
    assert set(EXPECTED) == set(UpstreamState)


@pytest.mark.parametrize("state", list(EXPECTED))
def test_each_state_gets_its_action_and_reason(state: UpstreamState) -> None:
    d = decide_on_status(status(state))
    assert (d.action, d.reason) == EXPECTED[state]


@pytest.mark.parametrize("state", [UpstreamState.FAILED, UpstreamState.NOT_FOUND, UpstreamState.EXPIRED])
def test_every_unrecoverable_state_fails_the_job(state: UpstreamState) -> None:
    # NOT_FOUND in particular: a lost task must be failed and refunded, never waited on
    # (RETRY_LATER) and never finalized (with the provider's not-found breaker closed, the default).
    assert decide_on_status(status(state)).action is Action.FAIL


def test_an_upstream_failure_carries_the_providers_message() -> None:
    d = decide_on_status(status(UpstreamState.FAILED, error="content policy violation"))
    assert d.reason == "upstream failed: content policy violation"


@pytest.mark.parametrize("error", [None, ""])
def test_an_upstream_failure_without_a_message_says_so(error: str | None) -> None:
    assert decide_on_status(status(UpstreamState.FAILED, error=error)).reason == "upstream failed: no message"


def test_with_the_breaker_open_not_found_is_retried_and_says_why() -> None:
    d = decide_on_status(status(UpstreamState.NOT_FOUND), breaker_open=True)
    assert d == Decision(
        Action.RETRY_LATER,
        "upstream task not found, but the provider's not-found breaker is open "
        "(a burst of not-found answers: likely a misconfiguration); not failing",
    )


def test_a_state_outside_the_enum_is_refused_loudly() -> None:
    # Never mapped to some action by accident: a new upstream state must be decided explicitly.
    bogus = UpstreamStatus.model_construct(provider_kind="kie-standard", task_id="t", state="paused")
    with pytest.raises(AssertionError, match="unhandled state 'paused'"):
        decide_on_status(bogus)


# --- the attempt cap --------------------------------------------------------------------------------


def test_the_default_cap_is_the_configured_max_attempts() -> None:
    assert decide_after_attempt(MAX_ATTEMPTS - 1) is Action.RETRY_LATER
    assert decide_after_attempt(MAX_ATTEMPTS) is Action.FORCE_FAIL


@pytest.mark.parametrize("cap", [1, 2, 3, 18, 50])
def test_every_boundary_of_the_cap(cap: int) -> None:
    # One below the cap is retried; reaching it force-fails; a job already past it (a cap lowered
    # while jobs were in flight, or a takeover that counted an extra attempt) force-fails too.
    assert decide_after_attempt(cap - 1, cap) is Action.RETRY_LATER
    assert decide_after_attempt(cap, cap) is Action.FORCE_FAIL
    assert decide_after_attempt(cap + 1, cap) is Action.FORCE_FAIL
    assert decide_after_attempt(cap + 10, cap) is Action.FORCE_FAIL


def test_below_the_cap_every_attempt_is_retried() -> None:
    assert [decide_after_attempt(n, 5) for n in range(0, 5)] == [Action.RETRY_LATER] * 5


def test_a_failure_message_says_it_came_from_reconciliation() -> None:
    assert failure_message("upstream task not found") == "reconcile: upstream task not found"
