"""The worker library against a real PostgreSQL and the loopback provider sandbox (spec 5.2, 5.3, 5.8)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import UnknownProviderKind
from recon_dagster.providers import ProvidersResource, UpstreamState, UpstreamStatus, providers_from_env
from recon_dagster.reconcile import app_worker as worker
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.factories import job_row, make_job
from recon_dagster_tests.support.ledger import anomalies

KIE_PAYLOAD = {"model": "flux-test", "input": {"prompt": "a lighthouse"}}
FAST = 0.01  # poll interval for runs against the sandbox


@pytest.fixture
def sb(sandbox: SandboxServer) -> SandboxServer:
    """The sandbox with no tasks, counters or default scenarios left by an earlier test."""
    sandbox.reset()
    return sandbox


@pytest.fixture
def providers(sb: SandboxServer) -> Iterator[ProvidersResource]:
    res = providers_from_env()
    yield res
    res.close()


def kie_run(providers: ProvidersResource, kind: str = "kie-standard") -> Callable[[Any], UpstreamStatus]:
    """The worker's normal call: create, report the task id, poll until terminal."""
    return lambda cb: providers.run(kind, KIE_PAYLOAD, on_task_created=cb, poll_interval_s=FAST)


# ---------------------------------------------------------------------------------------------
# on_task_created
# ---------------------------------------------------------------------------------------------


def test_on_task_created_persists_the_task_before_the_first_poll(
    db: sa.Engine, sb: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    sb.set_default_scenario("kie-standard", Scenario(polls_before_done=2))
    job = make_job(db, user, status="processing")
    persist = worker.make_on_task_created(job, "kie-standard", engine=db)
    seen: dict[str, Any] = {}

    def on_task_created(task_id: str) -> None:
        seen["polls_at_callback"] = sb.poll_count(task_id)
        persist(task_id)
        seen["row"] = job_row(db, job)
        seen["polls_after_write"] = sb.poll_count(task_id)

    status = providers.run("kie-standard", KIE_PAYLOAD, on_task_created=on_task_created, poll_interval_s=FAST)

    assert status.state is UpstreamState.SUCCEEDED
    task_id = status.task_id
    assert task_id is not None
    assert sb.task_info(task_id)["via_create"] is True
    # The row was written while the sandbox had seen no poll of the task yet.
    assert (seen["polls_at_callback"], seen["polls_after_write"]) == (0, 0)
    assert seen["row"]["provider_task_id"] == task_id
    assert sb.poll_count(task_id) == 3
    r = job_row(db, job)
    assert (r["provider_kind"], r["provider_task_id"]) == ("kie-standard", task_id)
    assert r["provider_call_started_at"] is not None
    assert r["status"] == "processing"  # the callback records; it never finishes a job


def test_on_task_created_for_a_missing_job_raises(db: sa.Engine) -> None:
    callback = worker.make_on_task_created(uuid.uuid4(), "kie-standard", engine=db)

    with pytest.raises(worker.JobNotFound):
        callback("task-1")


def test_on_task_created_with_an_unknown_kind_fails_when_built(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user)

    with pytest.raises(UnknownProviderKind, match="weird-kind"):
        worker.make_on_task_created(job, "weird-kind", engine=db)


@pytest.mark.parametrize("bad", ["", None], ids=["empty", "none"])
def test_on_task_created_refuses_a_missing_task_id_and_changes_nothing(
    db: sa.Engine, user: uuid.UUID, bad: str | None
) -> None:
    job = make_job(db, user, status="processing")
    callback = worker.make_on_task_created(job, "kie-standard", engine=db)

    with pytest.raises(ValueError, match="task"):
        callback(bad)  # type: ignore[arg-type]

    r = job_row(db, job)
    assert (r["provider_kind"], r["provider_task_id"], r["provider_call_started_at"]) == (None, None, None)
    assert anomalies(db, job) == []


# ---------------------------------------------------------------------------------------------
# run_or_resume: the stall-retry guard
# ---------------------------------------------------------------------------------------------


def test_stall_retry_resumes_the_persisted_task_without_creating(
    db: sa.Engine, sb: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    task = sb.add_task("kie-standard", Scenario(polls_before_done=0))
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=12)
    started = job_row(db, job)["provider_call_started_at"]
    creates_before = sb.create_count()
    called: list[bool] = []

    def create_and_run(cb: Any) -> UpstreamStatus:
        called.append(True)
        return kie_run(providers)(cb)

    status = worker.run_or_resume(job, "kie-standard", create_and_run, providers=providers, engine=db)

    assert sb.create_count() == creates_before
    assert called == []
    assert (status.task_id, status.state) == (task, UpstreamState.SUCCEEDED)
    assert sb.poll_count(task) == 1
    r = job_row(db, job)
    assert r["provider_call_started_at"] == started  # D8
    assert r["provider_task_id"] == task


def test_stall_retry_returns_the_resumed_tasks_failure(
    db: sa.Engine, sb: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    task = sb.add_task("kie-standard", Scenario(outcome="fail", polls_before_done=0, error_message="nsfw"))
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=12)
    creates_before = sb.create_count()

    status = worker.run_or_resume(job, "kie-standard", kie_run(providers), providers=providers, engine=db)

    assert (status.task_id, status.state) == (task, UpstreamState.FAILED)
    assert sb.create_count() == creates_before


def test_no_task_id_falls_back_to_one_create(
    db: sa.Engine, sb: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    sb.set_default_scenario("kie-standard", Scenario(polls_before_done=1))
    job = make_job(db, user, status="processing")
    creates_before = sb.create_count("kie-standard")

    status = worker.run_or_resume(job, "kie-standard", kie_run(providers), providers=providers, engine=db)

    assert sb.create_count("kie-standard") == creates_before + 1
    assert status.state is UpstreamState.SUCCEEDED
    r = job_row(db, job)
    assert (r["provider_kind"], r["provider_task_id"]) == ("kie-standard", status.task_id)
    assert r["provider_call_started_at"] is not None


def test_no_task_id_after_a_sync_style_mark_keeps_the_start_time(
    db: sa.Engine, sb: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    # A route that marked the call start and died before the create: the retry creates once and
    # the stale clock keeps running from the first mark (D8).
    job = make_job(db, user, provider_kind="kie-standard", started_minutes_ago=4)
    started = job_row(db, job)["provider_call_started_at"]
    sb.set_default_scenario("kie-standard", Scenario(polls_before_done=0))

    status = worker.run_or_resume(job, "kie-standard", kie_run(providers), providers=providers, engine=db)

    r = job_row(db, job)
    assert r["provider_task_id"] == status.task_id
    assert r["provider_call_started_at"] == started


@pytest.mark.parametrize("round_", range(3))
def test_two_workers_creating_at_once_end_on_one_task(
    db: sa.Engine, sb: SandboxServer, providers: ProvidersResource, user: uuid.UUID, round_: int
) -> None:
    sb.set_default_scenario("kie-standard", Scenario(polls_before_done=1))
    job = make_job(db, user, status="processing")
    both_read_the_row = threading.Barrier(2)
    created: dict[str, str] = {}
    raised: dict[str, BaseException] = {}
    results: dict[str, UpstreamStatus] = {}

    def worker_named(name: str) -> None:
        def create_and_run(cb: Callable[[str], None]) -> UpstreamStatus:
            both_read_the_row.wait(timeout=30)  # both saw no task id: both will create

            def on_task_created(task_id: str) -> None:
                created[name] = task_id
                try:
                    cb(task_id)
                except BaseException as exc:
                    raised[name] = exc
                    raise

            return providers.run(
                "kie-standard", KIE_PAYLOAD, on_task_created=on_task_created, poll_interval_s=FAST
            )

        results[name] = worker.run_or_resume(
            job, "kie-standard", create_and_run, providers=providers, engine=db
        )

    threads = [threading.Thread(target=worker_named, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert set(created) == {"a", "b"}
    assert created["a"] != created["b"]
    (loser,) = raised
    (winner,) = {"a", "b"} - {loser}
    dup = raised[loser]
    assert isinstance(dup, worker.TaskAlreadyPersisted)
    assert (dup.persisted, dup.ours) == (created[winner], created[loser])
    # Both workers end on the persisted task; the orphan is never polled.
    assert results[winner].task_id == results[loser].task_id == created[winner]
    assert results[loser].state is UpstreamState.SUCCEEDED
    assert sb.poll_count(created[loser]) == 0
    assert job_row(db, job)["provider_task_id"] == created[winner]
    (anomaly,) = anomalies(db, job)
    assert (anomaly["reason"], anomaly["user_id"]) == ("duplicate_upstream_task", user)
    assert anomaly["details"]["persisted_task_id"] == created[winner]
    assert anomaly["details"]["orphan_task_id"] == created[loser]


def test_run_or_resume_of_a_missing_job_creates_nothing(
    db: sa.Engine, sb: SandboxServer, providers: ProvidersResource
) -> None:
    with pytest.raises(worker.JobNotFound):
        worker.run_or_resume(uuid.uuid4(), "kie-standard", kie_run(providers), providers=providers, engine=db)

    assert sb.create_count() == 0


def test_unknown_kind_is_refused_before_any_upstream_call(
    db: sa.Engine, sb: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    job = make_job(db, user)

    with pytest.raises(UnknownProviderKind, match="weird-kind"):
        worker.run_or_resume(job, "weird-kind", kie_run(providers), providers=providers, engine=db)

    assert sb.create_count() == 0
    assert sb.requests_total() == 0
    r = job_row(db, job)
    assert (r["provider_kind"], r["provider_task_id"]) == (None, None)


# ---------------------------------------------------------------------------------------------
# Resume dispatches by provider_kind
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind", ["kie-veo", "replicate-prediction", "elevenlabs-async", "replicate-training"]
)
def test_resume_goes_to_each_kinds_own_endpoint(
    db: sa.Engine, sb: SandboxServer, providers: ProvidersResource, user: uuid.UUID, kind: str
) -> None:
    task = sb.add_task(kind, Scenario(polls_before_done=0))
    job = make_job(db, user, provider_kind=kind, provider_task_id=task, started_minutes_ago=40)

    def never(cb: Any) -> UpstreamStatus:
        raise AssertionError("a row with a task id must be resumed, not created again")

    status = worker.run_or_resume(job, kind, never, providers=providers, engine=db)

    assert (status.provider_kind, status.task_id, status.state) == (kind, task, UpstreamState.SUCCEEDED)
    assert sb.poll_count(task) > 0
    # Answered: the poll reached the endpoint of the task's own family (a wrong one answers
    # "not found" without counting an answer).
    assert sb.task_info(task)["answered_polls"] == 1
    assert sb.create_count() == 0


def test_resume_follows_the_rows_kind_over_the_callers(
    db: sa.Engine, sb: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    # The row is the record of what was created; a retry handler that passes another kind of the
    # same provider must still poll the endpoint the task lives on.
    task = sb.add_task("kie-veo", Scenario(polls_before_done=0))
    job = make_job(db, user, provider_kind="kie-veo", provider_task_id=task, started_minutes_ago=40)

    status = worker.run_or_resume(job, "kie-standard", kie_run(providers), providers=providers, engine=db)

    assert (status.provider_kind, status.task_id, status.state) == ("kie-veo", task, UpstreamState.SUCCEEDED)
    assert sb.task_info(task)["answered_polls"] == 1
    assert sb.create_count() == 0


# ---------------------------------------------------------------------------------------------
# mark_provider_call_start (sync routes, 5.8)
# ---------------------------------------------------------------------------------------------


def test_mark_provider_call_start_on_a_pending_row(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, status="pending")

    worker.mark_provider_call_start(job, "anthropic-sync", engine=db)

    r = job_row(db, job)
    assert (r["status"], r["provider_kind"], r["provider_task_id"]) == ("pending", "anthropic-sync", None)
    assert r["provider_call_started_at"] is not None


def test_mark_provider_call_start_refuses_an_unknown_kind_and_leaves_the_row(
    db: sa.Engine, user: uuid.UUID
) -> None:
    job = make_job(db, user, status="pending")

    with pytest.raises(UnknownProviderKind):
        worker.mark_provider_call_start(job, "weird-kind", engine=db)

    r = job_row(db, job)
    assert (r["provider_kind"], r["provider_call_started_at"]) == (None, None)


def test_mark_provider_call_start_of_a_missing_job_raises(db: sa.Engine) -> None:
    with pytest.raises(worker.JobNotFound):
        worker.mark_provider_call_start(uuid.uuid4(), "kie-llm", engine=db)
