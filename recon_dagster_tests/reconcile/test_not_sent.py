"""A poll this process never sent is not an attempt.

Whatever kept the poll in the process (the account's token comes after the poll's deadline, the
account is blocked by a provider's Retry-After, no slot came free in time, the limiter's database
does not answer), the job is rescheduled with the reason recorded: its attempt counter does not
move, not even at the last attempt before the cap, its credits stay reserved, nothing reached the
provider. A poll that reached the provider still counts, whatever came back, even if a later try
of the same request was refused. Real sensor, real runs, the sandbox over HTTP, the shared
limiter in PostgreSQL.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import KINDS, MAX_ATTEMPTS
from recon_dagster.providers.limit_config import account_limits_from_env
from recon_dagster.providers.limits import AccountLimiter, account_limiter
from recon_dagster.reconcile.decide import not_sent_reason
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row
from recon_dagster_tests.support.ledger import reconcile_events
from recon_dagster_tests.support.reconcile import make_defs, one, stale_job_with_task, tick, usage_status

pytestmark = pytest.mark.timeout(120)

# (kind, the provider's variable): one kind of each provider that polls.
POLLED = [
    ("kie-standard", "RECON_LIMIT_KIE"),
    ("replicate-prediction", "RECON_LIMIT_REPLICATE"),
    ("elevenlabs-async", "RECON_LIMIT_ELEVENLABS"),
]


def _provider(kind: str) -> str:
    return str(KINDS[kind].provider)


def _limiter(monkeypatch, kind: str, variable: str, spec: str) -> AccountLimiter:
    """This test's own account for ``kind``'s provider, configured as every process would see it."""
    monkeypatch.setenv("RECON_LIMITS", "database")
    monkeypatch.setenv(variable, f"{spec},account=t-{secrets.token_hex(4)}")
    limiter = account_limiter(account_limits_from_env(_provider(kind)))
    assert limiter is not None
    return limiter


def _spend_the_token(limiter: AccountLimiter) -> None:
    """Another process took the account's only read token of the hour."""
    AccountLimiter(limiter.limits, limiter._engine).take_token(create=False)


def _block(limiter: AccountLimiter) -> None:
    """A provider's Retry-After blocked the account for longer than a run waits for it."""
    AccountLimiter(limiter.limits, limiter._engine).block_for(3600)


def _hold_the_slot(limiter: AccountLimiter) -> None:
    assert AccountLimiter(limiter.limits, limiter._engine).take_slot("other-kind") is not None


def _lose_the_database(limiter: AccountLimiter) -> None:
    from recon_dagster.db.engine import get_engine

    dead = get_engine("postgresql://nobody@127.0.0.1:1/none")  # nothing listens on port 1
    limiter._engine = lambda: dead
    limiter._ready = False


# reason -> (budget spec, what another process did, the poll deadline)
REFUSALS: dict[str, tuple[str, Callable[[AccountLimiter], None], str]] = {
    "token_wait_past_deadline": ("reads=1/3600", _spend_the_token, "60"),
    "limiter_refused": ("reads=600/60", _block, "60"),
    "slot_wait_past_deadline": ("reads=600/60,concurrency=1", _hold_the_slot, "1.5"),
    "limiter_database_unreachable": ("reads=600/60,concurrency=4", _lose_the_database, "60"),
}


# Every reason with every polling provider, each reason both at a job's first attempt and at its
# last before the cap (where counting it would force-fail and refund a job nobody asked about).
CASES = [
    pytest.param(reason, kind, variable, attempts, id=f"{reason}-{kind}-{'last' if attempts else 'first'}")
    for i, reason in enumerate(REFUSALS)
    for j, (kind, variable) in enumerate(POLLED)
    for attempts in [MAX_ATTEMPTS - 1 if (i + j) % 2 else 0]
]


@pytest.mark.parametrize(("reason", "kind", "variable", "attempts"), CASES)
def test_a_poll_its_limiter_never_sent_is_rescheduled_not_counted(
    db, instance, media_dir, sandbox, monkeypatch, reason: str, kind: str, variable: str, attempts: int
) -> None:
    spec, refuse, deadline = REFUSALS[reason]
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", deadline)
    limiter = _limiter(monkeypatch, kind, variable, spec)
    _, job, task = stale_job_with_task(db, sandbox, kind, attempts=attempts)
    limiter.ensure()
    refuse(limiter)

    report = tick(make_defs(media_dir), instance)

    row = job_row(db, job)
    assert row["status"] == "processing", row
    assert row["reconcile_attempts"] == attempts  # not counted: not even the last one force-fails
    assert row["reconcile_lease_owner"] is None and row["reconcile_next_at"] is not None
    assert usage_status(db, job) == "reserved"
    assert sandbox.poll_count(task) == 0  # nothing reached the provider
    assert report.summary.not_sent == 1 and report.summary.errors == 0 and report.summary.exhausted == 0
    events = reconcile_events(db, job)
    assert [e.outcome for e in events] == ["not_sent"]
    assert not_sent_reason(events[0].detail) == reason, events[0].detail
    # Due again once the account lets polls out (at most one cadence), not a cadence of attempts.
    due_in = one(db, "SELECT EXTRACT(EPOCH FROM reconcile_next_at - now()) FROM jobs WHERE id = :j", j=job)
    assert 0 < float(due_in) <= 300
    _shown_by_explain_and_status(db, job, kind, reason)


def _shown_by_explain_and_status(db: sa.Engine, job, kind: str, reason: str) -> None:
    """The operator sees why: ``explain`` lists the unsent poll (not as an attempt) with its reason,
    ``status`` counts the job as rescheduled by reason, not as waiting out the cadence."""
    from recon_dagster.operator.explain import facts, load_story, to_json, to_text
    from recon_dagster.operator.status import explain, kind_status

    story = load_story(db, job)
    shown = dict(facts(story))
    assert reason in shown["polls not sent"] and "no attempt counted" in shown["polls not sent"]
    text = to_text(story, None)
    assert "#-" in text and reason in text and "not_sent" in text
    [entry] = to_json(story, None)["attempts"]
    assert entry["counted"] is False and entry["not_sent_reason"] == reason
    with db.connect() as conn:
        [row] = [r for r in kind_status(conn) if r["provider_kind"] == kind]
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
    assert row["not_sent"] == 1 and row["not_sent_reasons"] == {reason: 1} and row["cadence"] == 0
    assert reason in (explain(row, now) or "")


@pytest.mark.parametrize(("kind", "variable"), POLLED[:2], ids=[k for k, _ in POLLED[:2]])
def test_a_poll_that_reached_the_provider_counts_even_if_its_retry_was_refused(
    db, instance, media_dir, sandbox, monkeypatch, kind: str, variable: str
) -> None:
    """The first try is sent and answered 5xx; its retry's token comes in an hour: the request
    was sent, so the attempt counts (as today), with the refusal in the error."""
    _limiter(monkeypatch, kind, variable, "reads=1/3600")
    _, job, task = stale_job_with_task(db, sandbox, kind, Scenario(server_error_first=1, polls_before_done=0))

    report = tick(make_defs(media_dir), instance)

    row = job_row(db, job)
    assert sandbox.poll_count(task) >= 1
    assert row["status"] == "processing" and row["reconcile_attempts"] == 1, row
    assert "sent, then" in row["reconcile_last_error"] and "not sent" in row["reconcile_last_error"]
    assert report.summary.errors == 1 and report.summary.not_sent == 0
    assert [e.outcome for e in reconcile_events(db, job)] == ["error"]


def test_a_short_retry_after_is_waited_out_inside_the_run_and_the_poll_then_sent(
    db, instance, media_dir, sandbox, monkeypatch
) -> None:
    """A block that ends within the run's account wait costs neither an attempt nor a reschedule:
    the run sends the poll the moment the block ends, and the job completes in the same run."""
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "1")
    limiter = _limiter(monkeypatch, "kie-standard", "RECON_LIMIT_KIE", "reads=600/60")
    _, job, task = stale_job_with_task(db, sandbox, "kie-standard")
    limiter.ensure()
    AccountLimiter(limiter.limits, limiter._engine).block_for(3.0)
    blocked_at = time.monotonic()

    report = tick(make_defs(media_dir), instance)

    assert time.monotonic() - blocked_at >= 2.5  # the poll waited for the block
    row = job_row(db, job)
    assert row["status"] == "completed" and row["reconcile_attempts"] == 0, row
    assert sandbox.poll_count(task) == 1
    assert report.summary.recovered == 1 and report.summary.not_sent == 0


def test_a_rescheduled_job_is_requested_again_under_a_fresh_run_key_without_an_error(
    db, instance, media_dir, sandbox, monkeypatch
) -> None:
    """The run that rescheduled the job claimed it but left no attempt on it, so the job's next run
    has the same work key: it gets a retry suffix (Dagster never launches a run key twice), and
    rescheduling it three times is not the "runs keep ending before they claim" error."""
    from recon_dagster_tests.support.reconcile import evaluate_sensor

    limiter = _limiter(monkeypatch, "kie-standard", "RECON_LIMIT_KIE", "reads=600/60")
    _, job, task = stale_job_with_task(db, sandbox, "kie-standard")
    limiter.ensure()
    defs = make_defs(media_dir)
    for _ in range(3):
        _block(limiter)
        assert tick(defs, instance).summary.not_sent == 1
        with db.begin() as conn:  # the time passes: due again
            conn.execute(sa.text("UPDATE jobs SET reconcile_next_at = now() WHERE id = :j"), {"j": str(job)})
    with db.begin() as conn:  # the block ends
        conn.execute(
            sa.text("UPDATE provider_limit_accounts SET blocked_until = 'epoch' WHERE account = :a"),
            {"a": limiter.limits.account},
        )
        conn.execute(
            sa.text("UPDATE provider_limit_buckets SET stamp = now(), tokens = burst WHERE account = :a"),
            {"a": limiter.limits.account},
        )
    from recon_dagster.db.jobs import Claim
    from recon_dagster.defs.reconcile.sensors import fresh_keys
    from recon_dagster.reconcile.batches import Batch

    [request] = evaluate_sensor(defs, instance).run_requests
    assert request.run_key == f"{job}:1~3"
    _, stubborn = fresh_keys(instance, [Batch("kie-standard", (Claim(job, 1),), f"{job}:1")])
    assert stubborn == []  # they claimed it: not the "runs keep ending before they claim" error
    report = tick(defs, instance)
    assert report.summary.recovered == 1 and job_row(db, job)["reconcile_attempts"] == 0
    assert sandbox.poll_count(task) == 1
