"""A request this process never sent is not an attempt, whichever of its own limits kept it in (the
process's request cap, the account's slots and tokens, a Retry-After block, a held limiter row),
on every path that polls (a reconcile run, the worker library, the finalize's authenticated media
download); a refusal takes nothing from the account; a poll that was sent counts whatever came
back.
"""

from __future__ import annotations

import secrets
import threading
import time
from datetime import timedelta

import pytest

from recon_dagster.providers import ProviderHTTPError, providers_from_env
from recon_dagster.providers.status import NotSent, NotSentReason
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.ledger import reconcile_events
from recon_dagster_tests.support.payloads import PAYLOADS

pytestmark = pytest.mark.timeout(60)


@pytest.mark.slow
def test_a_poll_that_waits_past_its_deadline_for_the_process_cap_is_not_sent(sandbox, monkeypatch) -> None:
    """The process's own concurrency cap (``max_concurrency``) is full for longer than a poll's
    deadline: the poll is not sent (``slot_wait_past_deadline``) at its deadline, instead of
    waiting on and then going out with what is left of it (1 ms timeouts: a counted attempt)."""
    monkeypatch.setenv("RECON_LIMITS", "process")

    def kie(deadline_s: float):
        return providers_from_env().kie.model_copy(
            update={"max_concurrency": 1, "read_deadline_s": deadline_s}
        )

    slow = sandbox.add_task("kie-standard", Scenario(latency_s=3.0, outcome="run_forever"))
    fast = sandbox.add_task("kie-standard", Scenario(outcome="run_forever"))
    inside = threading.Thread(target=kie(10.0).poll, args=("kie-standard", slow))
    inside.start()
    try:
        time.sleep(0.5)  # the slow poll holds the process's only slot
        impatient = kie(1.0)
        started = time.monotonic()
        with pytest.raises(NotSent) as caught:
            impatient.poll("kie-standard", fast)
        assert caught.value.reason is NotSentReason.SLOT_WAIT
        assert time.monotonic() - started < 2.0  # at its deadline, not when the slot came free
        assert sandbox.poll_count(fast) == 0
    finally:
        inside.join(15)


# -- a Retry-After heard on one kind's create blocks every kind of the account --------------------

# provider -> (the variable, what hears the 429: a create's kind or a sync call, the kind polled)
THROTTLED_BY = {
    "kie": ("RECON_LIMIT_KIE", "kie-veo", "kie-standard"),
    "replicate": ("RECON_LIMIT_REPLICATE", "replicate-training", "replicate-prediction"),
    "elevenlabs": ("RECON_LIMIT_ELEVENLABS", "elevenlabs-sync", "elevenlabs-async"),
}


def _shared_account(monkeypatch, variable: str) -> str:
    account = f"probe-{secrets.token_hex(4)}"
    monkeypatch.setenv("RECON_LIMITS", "database")
    monkeypatch.setenv(variable, f"account={account}")
    return account


def _throttled_call(providers, kind: str) -> None:
    """One create (or sync call) of ``kind``; the sandbox answers it 429 with a Retry-After."""

    if kind == "elevenlabs-sync":
        providers.elevenlabs.model_copy(update={"max_attempts": 1}).text_to_speech("voice", "hello")
    else:
        resource = providers.for_kind(kind).model_copy(update={"max_attempts": 1})
        resource.create(kind, PAYLOADS[kind])


@pytest.mark.parametrize("provider", sorted(THROTTLED_BY))
def test_a_retry_after_on_a_create_keeps_every_kinds_polls_of_the_account_in(
    db, sandbox, monkeypatch, provider: str
) -> None:
    """A create (or a billed sync call) of one kind hears 429 Retry-After 30: a poll of another
    kind of the same account is not sent (``limiter_refused``, due again when the block ends),
    and nothing reaches the provider."""
    variable, throttled, polled = THROTTLED_BY[provider]
    _shared_account(monkeypatch, variable)
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "2")
    scenario = Scenario(rate_limit_first=1, create_rate_limit_first=1, retry_after_s=30)
    sandbox.set_default_scenario(throttled, scenario)
    task = sandbox.add_task(polled, Scenario(polls_before_done=0))
    providers = providers_from_env()

    with pytest.raises(ProviderHTTPError, match="429"):
        _throttled_call(providers, throttled)
    with pytest.raises(NotSent) as caught:
        providers.poll(polled, task)

    assert caught.value.reason is NotSentReason.LIMITER_REFUSED, caught.value
    assert caught.value.retry_in_s is not None and 25 < caught.value.retry_in_s <= 31
    assert sandbox.poll_count(task) == 0


@pytest.mark.slow
def test_anthropic_calls_wait_out_a_retry_after_another_call_heard(db, sandbox, monkeypatch) -> None:
    """Anthropic's calls are billed creates with no deadline: a call after another one heard 429
    Retry-After 2 is not sent during the block (it waits it out within the run's lease), then is."""
    _shared_account(monkeypatch, "RECON_LIMIT_ANTHROPIC")
    sandbox.set_default_scenario("anthropic-sync", Scenario(rate_limit_first=1, retry_after_s=2))
    anthropic = providers_from_env().anthropic.model_copy(update={"max_attempts": 1})
    messages = [{"role": "user", "content": "hi"}]

    with pytest.raises(ProviderHTTPError, match="429"):
        anthropic.messages("claude", messages, 16)
    heard = time.monotonic()
    assert anthropic.messages("claude", messages, 16)
    assert time.monotonic() - heard >= 1.5  # the block, not the old per-call retry, held it


# -- the worker library's poll loop -----------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_run_whose_poll_its_limiter_held_back_polls_again_instead_of_failing(
    db, sandbox, monkeypatch
) -> None:
    """The app's worker (``recon_dagster.worker``) creates a task and polls it to the end; right
    after the create another process hears a Retry-After for the account. The worker's next poll is
    not sent (nothing reached the provider): that is no answer and no failure, so the run polls
    again once the account lets it, within its budget, and ends with the task's result."""
    from recon_dagster.providers.limit_config import account_limits_from_env
    from recon_dagster.providers.limits import AccountLimiter, account_limiter
    from recon_dagster.worker import providers_from_env as worker_providers

    _shared_account(monkeypatch, "RECON_LIMIT_KIE")
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "0.5")
    sandbox.set_default_scenario("kie-standard", Scenario(polls_before_done=0))
    limiter = account_limiter(account_limits_from_env("kie"))
    assert limiter is not None

    def throttled_elsewhere(task_id: str) -> None:
        AccountLimiter(limiter.limits, limiter._engine).block_for(1.5)

    status = worker_providers().kie.run(
        "kie-standard", PAYLOADS["kie-standard"], on_task_created=throttled_elsewhere,
        poll_interval_s=0.1, budget_s=10,
    )  # fmt: skip
    assert status.state.value == "succeeded"


@pytest.mark.slow
def test_a_worker_run_whose_polls_stay_held_back_ends_resumable_at_its_budget(
    db, sandbox, monkeypatch
) -> None:
    """Held back for longer than the run's poll budget: the run ends as a run out of budget (the
    task is resumable, ``PollBudgetExceeded``), never as a provider error about a poll never sent."""
    from recon_dagster.providers import PollBudgetExceeded
    from recon_dagster.providers.limit_config import account_limits_from_env
    from recon_dagster.providers.limits import AccountLimiter, account_limiter
    from recon_dagster.worker import providers_from_env as worker_providers

    _shared_account(monkeypatch, "RECON_LIMIT_KIE")
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "0.5")
    limiter = account_limiter(account_limits_from_env("kie"))
    assert limiter is not None

    def throttled_elsewhere(task_id: str) -> None:
        AccountLimiter(limiter.limits, limiter._engine).block_for(60)

    started = time.monotonic()
    with pytest.raises(PollBudgetExceeded) as caught:
        worker_providers().kie.run(
            "kie-standard", PAYLOADS["kie-standard"], on_task_created=throttled_elsewhere,
            poll_interval_s=0.1, budget_s=2,
        )  # fmt: skip
    assert time.monotonic() - started < 6
    assert isinstance(caught.value.__cause__, NotSent)


def test_a_reconcile_poll_held_back_by_the_process_cap_is_rescheduled_not_counted(
    db, instance, media_dir, sandbox, monkeypatch
) -> None:
    """The whole chain with per-process limits: every request slot of the run's process is taken
    (other work of the same process) for longer than the poll's deadline; the run's poll is not
    sent, the job is rescheduled with the reason, its attempt counter untouched."""
    from recon_dagster.reconcile.decide import not_sent_reason
    from recon_dagster_tests.support.factories import job_row
    from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick

    monkeypatch.setenv("RECON_LIMITS", "process")
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "1")
    _, job, task = stale_job_with_task(db, sandbox, "kie-standard", attempts=3)
    semaphore = providers_from_env().kie.http._limiter.semaphore  # the process's, shared by every copy
    taken = 0
    while semaphore.acquire(blocking=False):
        taken += 1
    try:
        report = tick(make_defs(media_dir), instance)
    finally:
        for _ in range(taken):
            semaphore.release()

    row = job_row(db, job)
    assert row["reconcile_attempts"] == 3 and row["status"] == "processing", row
    assert sandbox.poll_count(task) == 0 and report.summary.not_sent == 1
    [event] = reconcile_events(db, job)
    assert event.outcome == "not_sent" and not_sent_reason(event.detail) == "slot_wait_past_deadline"


@pytest.mark.parametrize("exchange", ["refused_connection", "timeout"])
def test_a_poll_that_was_sent_counts_whatever_came_back(
    db, instance, media_dir, sandbox, monkeypatch, exchange: str
) -> None:
    """The other side of the rule: a poll that left the process counts as an attempt, also when
    nothing came back (the connection was refused, the answer never came within the deadline)."""
    from recon_dagster_tests.support.factories import job_row
    from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick

    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "1")
    scenario = Scenario(latency_s=3.0) if exchange == "timeout" else None
    _, job, _ = stale_job_with_task(db, sandbox, "kie-standard", scenario, attempts=2)
    if exchange == "refused_connection":
        monkeypatch.setenv("KIE_BASE_URL", "http://127.0.0.1:1")  # nothing listens on port 1

    report = tick(make_defs(media_dir), instance)

    row = job_row(db, job)
    assert row["reconcile_attempts"] == 3 and row["status"] == "processing", row
    assert report.summary.not_sent == 0 and [e.outcome for e in reconcile_events(db, job)] == ["error"]


# -- the finalize/media phase -------------------------------------------------------------------------


def test_an_authenticated_media_download_during_a_retry_after_block_is_not_sent(
    db, media_dir, sandbox, monkeypatch
) -> None:
    """The poll was answered (succeeded); before finalize downloads the dubbed audio from the
    ElevenLabs API, another process hears 429 Retry-After 300 for the account. The download is a
    request to the same API on the same key: it should wait for the account like a poll does."""
    from recon_dagster.media.store import LocalMediaStore
    from recon_dagster.providers.limit_config import account_limits_from_env
    from recon_dagster.providers.limits import AccountLimiter, account_limiter
    from recon_dagster.reconcile.finalize import MediaPolicy
    from recon_dagster.reconcile.reconciler import Reconciler
    from recon_dagster_tests.support.factories import job_row
    from recon_dagster_tests.support.reconcile import stale_job_with_task

    _shared_account(monkeypatch, "RECON_LIMIT_ELEVENLABS")
    limiter = account_limiter(account_limits_from_env("elevenlabs"))
    assert limiter is not None
    _, job, task = stale_job_with_task(
        db, sandbox, "elevenlabs-async", Scenario(polls_before_done=0), job_type="audio"
    )
    providers = providers_from_env()

    class ThrottledAfterThePoll:
        def poll(self, kind: str, task_id: str):
            status = providers.poll(kind, task_id)
            AccountLimiter(limiter.limits, limiter._engine).block_for(300)
            return status

        def media_headers(self, kind, ref):
            return providers.media_headers(kind, ref)

    from recon_dagster.db import jobs as jobs_db

    with db.begin() as conn:
        assert jobs_db.claim_jobs(conn, [jobs_db.Claim(job, 0)], "run-1", timedelta(minutes=15))
    rec = Reconciler(
        db, ThrottledAfterThePoll(), LocalMediaStore(base_dir=media_dir),
        media_policy=MediaPolicy(
            allowed_hosts=frozenset({"127.0.0.1"}), headers_for=providers.media_headers,
            slot_for=providers.media_slot,
        ),
    )  # fmt: skip
    outcome = rec.reconcile(job, "run-1")
    assert sandbox.media_downloads(task) == 0, outcome  # before: 1, sent into the block
    assert outcome.outcome.value == "not_sent" and "limiter_refused" in outcome.detail, outcome
    row = job_row(db, job)
    assert row["status"] == "processing" and row["reconcile_attempts"] == 0, row
    assert row["reconcile_lease_owner"] is None and row["reconcile_next_at"] is not None
