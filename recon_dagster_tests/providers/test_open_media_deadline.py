"""``open_media`` (``ProviderHttp.stream``) waits for the process's request slot only until the
read deadline, as a poll does (issue 49: it waited on the semaphore without any deadline)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from recon_dagster.providers.elevenlabs import ElevenLabsResource
from recon_dagster.providers.status import NotSent, NotSentReason
from recon_dagster.sandbox import SandboxServer, Scenario

pytestmark = pytest.mark.timeout(60)
KEY = "sandbox-key"


@pytest.fixture(scope="module")
def server() -> Iterator[SandboxServer]:
    with SandboxServer(api_key=KEY) as sb:
        yield sb


def test_a_media_stream_with_no_free_slot_is_not_sent_at_its_deadline(server: SandboxServer) -> None:
    task_id = server.add_task("elevenlabs-async", Scenario(polls_before_done=0, media_size=1000))
    res = ElevenLabsResource(
        base_url=server.api_base_url("elevenlabs"), api_key=KEY, max_concurrency=1, read_deadline_s=0.5,
        read_rate_per_s=None, create_rate_per_s=None,
    )  # fmt: skip
    (ref,) = res.poll("elevenlabs-async", task_id).media
    semaphore = res.http._limiter.semaphore
    outcome: list[BaseException | int] = []

    def fetch() -> None:
        try:
            with res.open_media(ref) as response:
                outcome.append(len(response.read()))
        except BaseException as exc:
            outcome.append(exc)

    assert semaphore.acquire(timeout=5)  # the process's one slot is busy with another request
    fetcher = threading.Thread(target=fetch, daemon=True)
    fetcher.start()
    fetcher.join(10)
    semaphore.release()
    fetcher.join(10)
    assert outcome and isinstance(outcome[0], NotSent), f"waited past its deadline for a slot: {outcome}"
    assert outcome[0].reason is NotSentReason.SLOT_WAIT
    # With the slot free, the same stream goes out and reads the whole object.
    with res.open_media(ref) as response:
        assert len(response.read()) == 1000
