"""The sandbox answers the providers' own official clients, not only ours.

Each test drives an official SDK (a dev dependency) through create / poll / fetch against
``recon-dagster sandbox`` over loopback HTTP. When a provider's SDK changes what it sends (a new
auth header, a new API version), this is the test that notices before a rehearsal does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import httpx
import pytest

from recon_dagster.sandbox import SandboxServer

KEY = "sdk-contract-key"
_T = TypeVar("_T")


@pytest.fixture(scope="module")
def sb() -> Iterator[SandboxServer]:
    with SandboxServer(api_key=KEY) as server:
        yield server


def _until(fetch: Callable[[], _T], done: Callable[[_T], bool], timeout_s: float = 20.0) -> _T:
    """Poll like an SDK user would, until ``done`` (bounded in time)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fetch()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


@pytest.mark.slow
def test_anthropic_sdk_creates_a_message_with_its_current_auth_and_version() -> None:
    anthropic = pytest.importorskip("anthropic")
    pass_through = {"max_retries": 0, "timeout": 10.0}
    with SandboxServer(api_key=KEY) as server:
        client = anthropic.Anthropic(api_key=KEY, base_url=server.api_base_url("anthropic"), **pass_through)
        message = client.messages.create(
            model="claude-sonnet-5-5", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
        )
        assert message.role == "assistant"
        assert message.content[0].type == "text" and message.content[0].text
        assert message.usage.input_tokens >= 0
        # A wrong key is still refused in the SDK's own error type, whatever header carries it.
        wrong = anthropic.Anthropic(
            api_key="not-the-key", base_url=server.api_base_url("anthropic"), **pass_through
        )
        with pytest.raises(anthropic.AuthenticationError):
            wrong.messages.create(
                model="claude-sonnet-5-5", max_tokens=8, messages=[{"role": "user", "content": "x"}]
            )


def test_anthropic_sdk_with_the_older_x_api_key_header_still_works(sb: SandboxServer) -> None:
    # Our own client and older SDKs send x-api-key; the service accepts both.
    response = httpx.post(
        f"{sb.api_base_url('anthropic')}/v1/messages",
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
        json={"model": "claude-sonnet-5-5", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
        timeout=10,
    )
    assert response.status_code == 200, response.text


def test_replicate_sdk_creates_polls_and_fetches_a_prediction(sb: SandboxServer) -> None:
    replicate = pytest.importorskip("replicate")
    client = replicate.Client(api_token=KEY, base_url=f"{sb.base_url}/replicate")
    prediction = client.predictions.create(version="abc123", input={"prompt": "a cat"})
    assert prediction.id and prediction.status in ("starting", "processing", "succeeded")
    final = _until(
        lambda: client.predictions.get(prediction.id),
        lambda p: p.status in ("succeeded", "failed", "canceled"),
    )
    assert final.status == "succeeded", final
    urls = final.output if isinstance(final.output, list) else [final.output]
    fetched = httpx.get(str(urls[0]), timeout=10)
    assert fetched.status_code == 200 and len(fetched.content) > 0


def test_replicate_sdk_creates_and_polls_a_training(sb: SandboxServer) -> None:
    replicate = pytest.importorskip("replicate")
    client = replicate.Client(api_token=KEY, base_url=f"{sb.base_url}/replicate")
    training = client.trainings.create(
        model="ostris/flux-dev-lora-trainer",
        version="e440909d3512c31646ee2e0c7d6f6f4923224863a6a10c494606e79fb5844497",
        input={"input_images": "https://example.invalid/images.zip"},
        destination="someone/character-lora",
    )
    assert training.id
    final = _until(
        lambda: client.trainings.get(training.id),
        lambda t: t.status in ("succeeded", "failed", "canceled"),
    )
    assert final.status == "succeeded", final
    assert final.output, final


def test_replicate_sdk_with_a_wrong_token_gets_its_own_error(sb: SandboxServer) -> None:
    replicate = pytest.importorskip("replicate")
    from replicate.exceptions import ReplicateError

    client = replicate.Client(api_token="wrong", base_url=f"{sb.base_url}/replicate")
    with pytest.raises(ReplicateError) as raised:
        client.predictions.create(version="abc123", input={"prompt": "x"})
    assert raised.value.status == 401


def test_elevenlabs_sdk_dubs_polls_and_fetches_audio(sb: SandboxServer, tmp_path) -> None:
    elevenlabs = pytest.importorskip("elevenlabs")
    client = elevenlabs.ElevenLabs(api_key=KEY, base_url=f"{sb.base_url}/elevenlabs")
    source = tmp_path / "source.mp3"
    source.write_bytes(b"ID3" + bytes(256))
    with source.open("rb") as handle:
        created = client.dubbing.create(file=handle, target_lang="es", source_lang="en")
    assert created.dubbing_id
    final = _until(
        lambda: client.dubbing.get(created.dubbing_id),
        lambda d: d.status in ("dubbed", "failed"),
    )
    assert final.status == "dubbed", final
    audio = b"".join(client.dubbing.audio.get(created.dubbing_id, "es"))
    assert len(audio) > 0


@pytest.mark.slow
def test_elevenlabs_sdk_converts_text_to_speech(sb: SandboxServer) -> None:
    elevenlabs = pytest.importorskip("elevenlabs")
    client = elevenlabs.ElevenLabs(api_key=KEY, base_url=f"{sb.base_url}/elevenlabs")
    audio = b"".join(client.text_to_speech.convert("voice-1", text="Hello there", model_id="eleven_v3"))
    assert len(audio) > 0
