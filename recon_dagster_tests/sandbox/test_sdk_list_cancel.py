"""The official ``replicate`` SDK lists and cancels predictions against the sandbox: pages through
``next``, newest first, and ``predictions.cancel`` stops a running one."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster.sandbox.routes.replicate_tasks import PAGE_SIZE

KEY = "sdk-list-key"


@pytest.fixture(scope="module")
def sb() -> Iterator[SandboxServer]:
    with SandboxServer(api_key=KEY) as server:
        yield server


@pytest.mark.parametrize("count", [0, 1, PAGE_SIZE, PAGE_SIZE + 1, 2 * PAGE_SIZE + 7])
def test_replicate_sdk_pages_through_every_prediction_newest_first(sb: SandboxServer, count: int) -> None:
    replicate = pytest.importorskip("replicate")
    from replicate.pagination import paginate

    sb.reset()
    state = sb.sandbox.state
    now = time.time()
    seeded = [
        state.add_task("replicate-prediction", Scenario(), created_at=now - i, input={"n": i}).task_id
        for i in range(count)
    ]
    state.add_task("replicate-training", Scenario(), created_at=now)  # another collection: not listed
    client = replicate.Client(api_token=KEY, base_url=f"{sb.base_url}/replicate")

    listed = [p.id for page in paginate(client.predictions.list) for p in page]

    assert listed == seeded  # newest first, each exactly once


def test_replicate_sdk_cancels_a_running_prediction_and_not_a_finished_one(sb: SandboxServer) -> None:
    replicate = pytest.importorskip("replicate")
    sb.reset()
    running = sb.add_task("replicate-prediction", Scenario(outcome="run_forever"))
    done = sb.add_task("replicate-prediction", Scenario(polls_before_done=0))
    client = replicate.Client(api_token=KEY, base_url=f"{sb.base_url}/replicate")

    assert client.predictions.cancel(running).status == "canceled"
    assert client.predictions.get(running).status == "canceled"
    assert client.predictions.cancel(done).status == "succeeded"
    statuses = {p.id: p.status for p in client.predictions.list().results}
    assert statuses == {running: "canceled", done: "succeeded"}
