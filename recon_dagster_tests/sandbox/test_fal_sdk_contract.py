"""The sandbox's fal queue answers fal's own Python client (``fal-client``), not only ours.

fal-client builds its queue URLs from ``https://{FAL_QUEUE_RUN_HOST}/`` (read once, at import) and
then follows the ``status_url``/``response_url``/``cancel_url`` the submit answer gives it; the
test points the one module constant at the loopback sandbox (``/fal/`` over plain HTTP), which
is what ``FAL_QUEUE_RUN_HOST`` would do against a TLS host. Everything else is the client as
shipped: its ``Authorization: Key`` header, its status parsing, its error type.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from recon_dagster.sandbox import SandboxServer, Scenario

fal_client = pytest.importorskip("fal_client")
fal_client_module = pytest.importorskip("fal_client.client")

KEY = "fal-contract-key"
IMAGE_MODEL = "fal-ai/flux/dev"
VIDEO_MODEL = "fal-ai/kling-video/v2/master/text-to-video"


@pytest.fixture(scope="module")
def sb() -> Iterator[SandboxServer]:
    with SandboxServer(api_key=KEY) as server:
        yield server


@pytest.fixture
def client(sb: SandboxServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    sb.reset()
    monkeypatch.setattr(fal_client_module, "QUEUE_URL_FORMAT", f"{sb.base_url}/fal/")
    return fal_client.SyncClient(key=KEY, default_timeout=10.0)


def _scenario(**fields: Any) -> dict[str, Any]:
    return Scenario(**fields).to_dict()


def test_submit_status_and_result_of_an_image_model_with_a_subpath(client: Any, sb: SandboxServer) -> None:
    handle = client.submit(
        IMAGE_MODEL, {"prompt": "a cat", "sandbox_scenario": _scenario(polls_before_done=2)}
    )
    assert handle.request_id
    # The status URL fal gives is at the app (owner/app), not at the model's endpoint path.
    assert handle.status_url.endswith(f"/fal/fal-ai/flux/requests/{handle.request_id}/status")
    first = handle.status()
    assert isinstance(first, fal_client.Queued) and first.position == 0
    assert isinstance(handle.status(), fal_client.InProgress)
    done = handle.status()
    assert isinstance(done, fal_client.Completed) and done.error is None
    result = handle.get()
    image = result["images"][0]
    assert image["url"].startswith(f"{sb.base_url}/media/") and image["content_type"] == "image/png"
    # The client's own by-id calls (built from the app id) reach the same request.
    assert isinstance(client.status(IMAGE_MODEL, handle.request_id), fal_client.Completed)
    assert client.result(IMAGE_MODEL, handle.request_id)["images"][0]["url"] == image["url"]
    assert sb.create_count("fal-image") == 1


def test_a_video_model_answers_one_video_file(client: Any) -> None:
    handle = client.submit(
        VIDEO_MODEL, {"prompt": "waves", "sandbox_scenario": _scenario(polls_before_done=0)}
    )
    video = handle.get()["video"]
    assert video["content_type"] == "video/mp4" and video["url"].endswith(".mp4")


def test_a_failed_request_completes_with_its_error_and_type(client: Any) -> None:
    handle = client.submit(
        IMAGE_MODEL,
        {
            "prompt": "x",
            "sandbox_scenario": _scenario(outcome="fail", polls_before_done=0, error_message="nsfw"),
        },
    )
    status = handle.status()
    assert isinstance(status, fal_client.Completed)
    assert status.error == "nsfw" and status.error_type == "internal_server_error"


def test_cancel_a_queued_request_then_it_is_already_completed(client: Any) -> None:
    handle = client.submit(VIDEO_MODEL, {"prompt": "x", "sandbox_scenario": _scenario(outcome="run_forever")})
    assert isinstance(handle.status(), fal_client.Queued)
    client.cancel(VIDEO_MODEL, handle.request_id)
    status = handle.status()
    assert isinstance(status, fal_client.Completed) and status.error
    with pytest.raises(fal_client.FalClientHTTPError) as info:
        handle.cancel()
    assert info.value.status_code == 400


def test_a_wrong_key_is_refused_in_the_clients_error_type(
    sb: SandboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fal_client_module, "QUEUE_URL_FORMAT", f"{sb.base_url}/fal/")
    wrong = fal_client.SyncClient(key="not-the-key", default_timeout=10.0)
    with pytest.raises(fal_client.FalClientHTTPError) as info:
        wrong.submit(IMAGE_MODEL, {"prompt": "x"})
    assert info.value.status_code == 401 and info.value.error_type == "authentication_error"
