"""A task nobody recorded on its job row is found and adopted, and the reconciler then recovers
it and charges it exactly once: a worker killed between the provider's answer and the row's
update (the named crash point), and a create whose answer was lost (ambiguous), which the stale
sweep no longer fails and refunds before the orphan sweep has looked for its task.

A worker retried after its create may have made a task never sends a second create
(``recon.open_create``, migration 161, the contract the Node package keeps): killed between the
create's send and its answer, or with the answer lost, the retry stops with ``CreateMayExist``
until the orphan sweep (or the operator) has put the task on the row; then it resumes that task."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.db import ledger
from recon_dagster.operator.orphans import adopt_probable
from recon_dagster.providers import AmbiguousCreateError, ProvidersResource, providers_from_env
from recon_dagster.reconcile.app_worker import CreateMayExist, make_on_task_created, run_or_resume
from recon_dagster.reconcile.orphan_sweep import SweepPolicy
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.factories import balances, job_row, make_job, reserve
from recon_dagster_tests.support.orphans import actions, sweep
from recon_dagster_tests.support.reconcile import make_defs, tick, usage_status

PAYLOAD = {"version": "v1", "input": {"prompt": "a lighthouse at dusk"}}
KIE_PAYLOAD = {"model": "flux", "input": {"prompt": "a lighthouse at dusk"}}

WORKER = """
import sys
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.app_worker import CreateMayExist, make_on_task_created, run_or_resume
from recon_dagster.reconcile.orphan_sweep import SweepPolicy
p = providers_from_env()
payload = {"version": "v1", "input": {"prompt": "a lighthouse at dusk"}}
run_or_resume(sys.argv[1], "replicate-prediction",
              lambda cb: p.run("replicate-prediction", payload, on_task_created=cb, poll_interval_s=0.01),
              providers=p)
"""


@pytest.fixture
def providers(sandbox: SandboxServer) -> Iterator[ProvidersResource]:
    sandbox.reset()
    with contextlib.closing(providers_from_env()) as res:
        yield res


def creates(db: sa.Engine, job: uuid.UUID) -> list[ledger.Create]:
    with db.connect() as conn:
        return ledger.creates_of_job(conn, job)


def policy() -> SweepPolicy:
    return SweepPolicy(window=timedelta(hours=6), grace=timedelta(0), act=True, shadowed=lambda kind: False)


def stalled(db: sa.Engine, job: uuid.UUID, minutes: int = 40) -> None:
    """Time passes: the adopted job's provider call is past its kind's threshold."""
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET provider_call_started_at = now() - make_interval(mins => :m) WHERE id = :j"
            ),
            {"m": minutes, "j": str(job)},
        )


def test_a_worker_killed_between_the_answer_and_the_row_update_leaves_a_task_adopted_and_charged_once(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance, media_dir: str,
) -> None:  # fmt: skip
    sandbox.set_default_scenario("replicate-prediction", Scenario(polls_before_done=0))
    job = make_job(db, user, job_type="image", status="processing")
    reserve(db, job, user, 30)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECON_CRASH_")}
    died = subprocess.run(
        [sys.executable, "-c", WORKER, str(job)], env={**env, "RECON_CRASH_AT": "worker.after_create"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert died.returncode == -signal.SIGKILL, died.stderr
    [create] = creates(db, job)
    assert create.task_id is not None and job_row(db, job)["provider_task_id"] is None
    # The queue retries the handler: the ledger names a task the row does not, so no second
    # create (recon.open_create, migration 170) until the sweep has adopted it.
    retry = subprocess.run(
        [sys.executable, "-c", WORKER, str(job)], env=env, capture_output=True, text=True, timeout=120
    )
    assert sandbox.create_count() == 1
    assert retry.returncode != 0 and "CreateMayExist" in retry.stderr, retry.stderr
    assert actions(sweep(db, providers)) == {create.task_id: "adopt"}
    assert job_row(db, job)["provider_task_id"] == create.task_id
    stalled(db, job)
    tick(make_defs(media_dir), instance)
    tick(make_defs(media_dir), instance, sweep=True)
    assert actions(sweep(db, providers)) == {create.task_id: "owned"}

    assert job_row(db, job)["status"] == "completed"
    assert usage_status(db, job) == "committed"
    assert balances(db, user) == (Decimal(70), Decimal(50))  # charged once, never refunded
    assert sandbox.create_count() == 1


def test_an_ambiguous_create_is_not_refunded_before_its_task_is_looked_for_then_adopted_by_the_operator(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance, media_dir: str,
) -> None:  # fmt: skip
    sandbox.set_default_scenario(
        "replicate-prediction", Scenario(polls_before_done=0, create_lost_response_first=1)
    )
    other = sandbox.add_task("replicate-prediction", Scenario(outcome="run_forever"))  # not ours
    job = make_job(db, user, status="processing", created_minutes_ago=200)  # past the pre-call budget
    reserve(db, job, user, 30)
    with pytest.raises(AmbiguousCreateError):
        run_or_resume(
            job, "replicate-prediction",
            lambda cb: providers.run("replicate-prediction", PAYLOAD, on_task_created=cb, poll_interval_s=0.01),
            providers=providers, engine=db,
        )  # fmt: skip
    [create] = creates(db, job)
    assert (create.state, create.task_id) == ("ambiguous", None)

    tick(make_defs(media_dir), instance, sweep=True)  # the stale sweep leaves it for the orphan sweep
    assert job_row(db, job)["status"] == "processing" and balances(db, user) == (Decimal(70), Decimal(50))
    report = sweep(db, providers)
    # Replicate's list shows no webhook, so no marker: the lost create's task only resembles it.
    [task] = [t for t, a in actions(report).items() if a == "probably_ours"]
    assert actions(report)[other] == "unknown"
    assert job_row(db, job)["provider_task_id"] is None  # never adopted on a resemblance
    tick(make_defs(media_dir), instance, sweep=True)
    assert job_row(db, job)["status"] == "processing"  # and the job waits for the operator
    adopt_probable(db, providers, task, job, policy(), who="ops", why="our prompt, our minute")
    stalled(db, job)
    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "completed"
    assert job_row(db, job)["provider_task_id"] == task
    assert usage_status(db, job) == "committed"
    assert balances(db, user) == (Decimal(70), Decimal(50))
    assert sandbox.task_info(other)["canceled"] is False


def test_an_ambiguous_create_at_a_provider_that_cannot_list_is_swept_as_before(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance, media_dir: str,
) -> None:  # fmt: skip
    sandbox.set_default_scenario("kie-standard", Scenario(create_lost_response_first=1))
    job = make_job(db, user, status="processing", created_minutes_ago=200)
    reserve(db, job, user, 30)
    with pytest.raises(AmbiguousCreateError):
        run_or_resume(
            job, "kie-standard",
            lambda cb: providers.run("kie-standard", KIE_PAYLOAD, on_task_created=cb, poll_interval_s=0.01),
            providers=providers, engine=db,
        )  # fmt: skip

    tick(make_defs(media_dir), instance, sweep=True)

    assert job_row(db, job)["status"] == "failed"
    assert balances(db, user) == (Decimal(100), Decimal(50))


def test_an_ambiguous_create_is_swept_once_the_orphan_sweep_looked_and_found_nothing(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance, media_dir: str,
) -> None:  # fmt: skip
    job = make_job(db, user, status="processing", created_minutes_ago=200)
    reserve(db, job, user, 30)
    with db.begin() as conn:
        intent = ledger.record_intent(
            conn,
            job,
            provider="replicate",
            kind="replicate-prediction",
            fingerprint="nothing",
            marker_sent=True,
        )
        ledger.record_outcome(conn, intent.id, ledger.CreateState.AMBIGUOUS, "answer lost")

    tick(make_defs(media_dir), instance, sweep=True)
    assert job_row(db, job)["status"] == "processing"
    assert sweep(db, providers).looked == 1
    tick(make_defs(media_dir), instance, sweep=True)

    assert job_row(db, job)["status"] == "failed"
    assert balances(db, user) == (Decimal(100), Decimal(50))


KIND = "replicate-prediction"


def worker_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RECON_CRASH_")}


def kill_between_send_and_answer(db: sa.Engine, sandbox: SandboxServer, job: uuid.UUID) -> None:
    """Start the app's worker process on ``job`` and SIGKILL it once the sandbox has accepted its
    create (the task exists upstream) while the answer is still on its way (the scenario's
    latency holds it back): the ledger keeps the create as ``sending``, the row names no task."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(job)], env=worker_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while sandbox.create_count(KIND) < 1:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the worker never sent its create"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    [create] = creates(db, job)
    assert (create.state, create.task_id) == ("sending", None)  # the answer never came back


def test_a_worker_killed_between_the_create_and_its_answer_is_retried_without_a_second_create(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance, media_dir: str,
) -> None:  # fmt: skip
    sandbox.set_default_scenario(KIND, Scenario(polls_before_done=0, latency_s=2.0))
    job = make_job(db, user, job_type="image", status="processing")
    reserve(db, job, user, 30)
    kill_between_send_and_answer(db, sandbox, job)

    # The queue retries the handler in a new process: it looks, and does not create again.
    retry = subprocess.run(
        [sys.executable, "-c", WORKER, str(job)],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sandbox.create_count(KIND) == 1
    assert retry.returncode != 0 and "CreateMayExist" in retry.stderr, retry.stderr
    assert [c.state for c in creates(db, job)] == ["sending"]

    # Replicate's list shows no webhook, so no marker proof: the task only resembles the lost
    # create (issue 46) and waits for the operator (`recon-dagster orphans --adopt TASK --job JOB`).
    report = sweep(db, providers)
    [task] = [t for t, a in actions(report).items() if a == "probably_ours"]
    assert job_row(db, job)["provider_task_id"] is None
    adopt_probable(db, providers, task, job, policy(), who="ops", why="killed mid-create, our prompt")

    # A retry now resumes the adopted task (no create); the reconciler settles the job once.
    resumed = run_or_resume(
        job, KIND, lambda cb: pytest.fail("created again"), providers=providers, engine=db
    )
    assert resumed.task_id == task
    stalled(db, job)
    tick(make_defs(media_dir), instance)

    assert sandbox.create_count(KIND) == 1
    assert job_row(db, job)["status"] == "completed"
    assert usage_status(db, job) == "committed"
    assert balances(db, user) == (Decimal(70), Decimal(50))  # charged once, never refunded


def test_a_retry_after_a_lost_answer_does_not_create_again(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    sandbox.set_default_scenario(KIND, Scenario(polls_before_done=0, create_lost_response_first=1))
    job = make_job(db, user, status="processing")

    def attempt() -> object:
        return run_or_resume(
            job, KIND,
            lambda cb: providers.run(KIND, PAYLOAD, on_task_created=cb, poll_interval_s=0.01),
            providers=providers, engine=db,
        )  # fmt: skip

    with pytest.raises(Exception, match="lost|answer") as first:
        attempt()
    assert not isinstance(first.value, CreateMayExist)
    with pytest.raises(CreateMayExist) as held:
        attempt()

    assert sandbox.create_count(KIND) == 1
    [create] = creates(db, job)
    assert (create.state, held.value.create_id) == ("ambiguous", str(create.id))


def test_a_recorder_used_without_run_or_resume_does_not_send_while_a_create_may_exist(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    """The provider's ``run`` with the library's callback asks ``recon.open_create`` before it
    sends, so a worker that skips ``run_or_resume`` keeps the rule too."""
    job = make_job(db, user, status="processing")
    with db.begin() as conn:  # a create of an earlier attempt whose worker died mid-send
        ledger.record_intent(conn, job, provider="replicate", kind=KIND, fingerprint="f", marker_sent=True)

    with pytest.raises(CreateMayExist):
        providers.run(KIND, PAYLOAD, on_task_created=make_on_task_created(job, KIND, engine=db))

    assert sandbox.create_count(KIND) == 0
    assert [c.state for c in creates(db, job)] == ["sending"]
