"""List and cancel on the provider adapters that can (Replicate predictions and trainings,
ElevenLabs dubbing), over HTTP to the sandbox: every page, the time window, the phases, cancel,
and ``Cancel-After`` / the job marker on a create."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from recon_dagster.config import Settings
from recon_dagster.providers import ProvidersResource, providers_from_env
from recon_dagster.providers.upstream_tasks import CancelResult, TaskCancelling, TaskListing, TaskPhase
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster.sandbox.routes.replicate_tasks import PAGE_SIZE


@pytest.fixture
def providers(sandbox: SandboxServer) -> Iterator[ProvidersResource]:
    sandbox.reset()
    with contextlib.closing(providers_from_env()) as res:
        yield res


def ago(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)


def test_the_listing_capabilities_are_where_the_providers_have_them(providers: ProvidersResource) -> None:
    assert isinstance(providers.replicate, TaskListing) and isinstance(providers.replicate, TaskCancelling)
    assert isinstance(providers.elevenlabs, TaskListing) and isinstance(providers.elevenlabs, TaskCancelling)
    assert not isinstance(providers.kie, TaskListing)


@pytest.mark.parametrize("count", [0, 3, PAGE_SIZE, PAGE_SIZE + 1, 2 * PAGE_SIZE + 3])
def test_replicate_lists_every_task_of_the_window_once(
    sandbox: SandboxServer, providers: ProvidersResource, count: int
) -> None:
    state = sandbox.sandbox.state
    now = time.time()
    inside = [state.add_task("replicate-prediction", created_at=now - 10 - i).task_id for i in range(count)]
    trainings = [state.add_task("replicate-training", created_at=now - 20).task_id]
    state.add_task("replicate-prediction", created_at=now - 7200)  # before the window
    state.add_task("replicate-prediction", created_at=now + 3600)  # after it

    listed = list(providers.replicate.list_tasks(created_after=ago(3600), created_before=ago(-60)))

    assert [t.task_id for t in listed] == inside + trainings
    assert {t.collection for t in listed} <= {"predictions", "trainings"}
    pages = -(-count // PAGE_SIZE) + 1 if count else 2
    assert sandbox.stats()["requests_total"] == pages


def test_replicate_phases_cost_and_cancel(sandbox: SandboxServer, providers: ProvidersResource) -> None:
    running = sandbox.add_task("replicate-prediction", Scenario(outcome="run_forever"))
    done = sandbox.add_task("replicate-prediction", Scenario(polls_before_done=0))
    failed = sandbox.add_task("replicate-prediction", Scenario(polls_before_done=0, outcome="fail"))

    listed = {t.task_id: t for t in providers.replicate.list_tasks(created_after=ago(60))}

    assert (listed[running].phase, listed[done].phase, listed[failed].phase) == (
        TaskPhase.RUNNING, TaskPhase.SUCCEEDED, TaskPhase.ENDED,
    )  # fmt: skip
    assert "predict_time" in listed[done].metrics
    assert listed[done].fingerprint is not None
    assert providers.replicate.cancel_task("predictions", running) is CancelResult.CANCELLED
    assert providers.replicate.cancel_task("predictions", done) is CancelResult.ALREADY_ENDED
    assert providers.replicate.cancel_task("predictions", "no-such-task") is CancelResult.NOT_FOUND
    assert sandbox.task_info(running)["canceled"] is True


def test_elevenlabs_lists_dubs_across_pages_and_deletes_a_running_one(
    sandbox: SandboxServer, providers: ProvidersResource
) -> None:
    state = sandbox.sandbox.state
    now = time.time()
    dubs = [state.add_task("elevenlabs-async", created_at=now - i).task_id for i in range(205)]
    state.add_task("elevenlabs-async", created_at=now - 7200)

    listed = list(providers.elevenlabs.list_tasks(created_after=ago(3600)))

    assert [t.task_id for t in listed] == dubs
    assert {t.phase for t in listed} == {TaskPhase.RUNNING}
    assert providers.elevenlabs.cancel_task("dubbing", dubs[0]) is CancelResult.CANCELLED
    assert providers.elevenlabs.cancel_task("dubbing", dubs[0]) is CancelResult.NOT_FOUND
    assert dubs[0] not in {t.task_id for t in providers.elevenlabs.list_tasks(created_after=ago(3600))}


def test_a_replicate_create_carries_cancel_after_derived_from_the_kind(
    sandbox: SandboxServer, providers: ProvidersResource, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = providers.replicate.create("replicate-prediction", {"version": "v1", "input": {"p": 1}})
    # 20 min threshold + 18 attempts x 5 min cadence.
    assert sandbox.sandbox.state.get(task).meta["cancel_after"] == f"{(20 + 18 * 5) * 60}s"

    monkeypatch.setenv(Settings.replicate_cancel_after_s.name, "0")
    bare = providers.replicate.create("replicate-prediction", {"version": "v1", "input": {"p": 1}})
    assert "cancel_after" not in sandbox.sandbox.state.get(bare).meta
