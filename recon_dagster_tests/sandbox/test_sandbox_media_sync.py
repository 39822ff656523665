"""The provider sandbox's media (signed-URL errors, real bytes, streaming, dubbing audio) and its sync
kinds (Anthropic messages, KIE chat, ElevenLabs TTS, calls held open)."""

from __future__ import annotations

import hashlib
import io
import threading
import time
import tracemalloc

import httpx
import pytest
from PIL import Image

from recon_dagster.core.kinds import SYNC_KINDS
from recon_dagster.sandbox import SandboxServer, Scenario, media_digest
from recon_dagster_tests.support.sandbox_api import ANTH, BEARER, XI, create, poll

# -- media -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "code"), [(403, "AccessDenied"), (404, "NoSuchKey"), (410, "Gone")])
def test_expired_signed_url_statuses(client: httpx.Client, sb: SandboxServer, status: int, code: str) -> None:
    tid = sb.add_task("kie-standard", Scenario(polls_before_done=0, media_status=status))
    r = client.get(sb.media_url(tid))
    assert r.status_code == status and f"<Code>{code}</Code>" in r.text
    assert sb.media_downloads(tid) == 1


def test_runway_expired_flag_and_media_403(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-runway", Scenario(polls_before_done=0, expired=True))
    data = poll(client, "kie-runway", tid).json()["data"]
    assert data["state"] == "success" and data["expireFlag"] == 1
    assert client.get(data["videoInfo"]["videoUrl"]).status_code == 403


def test_replicate_data_removed(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("replicate-prediction", Scenario(polls_before_done=0, data_removed=True))
    body = poll(client, "replicate-prediction", tid).json()
    assert body["status"] == "succeeded" and body["output"] is None and body["data_removed"] is True
    assert client.get(sb.media_url(tid)).status_code == 404


def test_failed_task_has_no_media(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-veo", Scenario(outcome="fail"))
    assert client.get(sb.media_url(tid)).status_code == 404


def test_image_is_a_real_png(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-kontext", Scenario(polls_before_done=0))
    img = Image.open(io.BytesIO(client.get(sb.media_url(tid)).content))
    assert img.format == "PNG" and img.size == (64, 64)


def test_media_bytes_are_deterministic_and_sized(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-veo", Scenario(polls_before_done=0, media_size=200_001))
    first, second = client.get(sb.media_url(tid)).content, client.get(sb.media_url(tid)).content
    assert first == second and len(first) == 200_001
    assert first[4:8] == b"ftyp"
    assert hashlib.sha256(first).hexdigest() == media_digest(tid, 0, "video", 200_001)
    assert client.head(sb.media_url(tid)).headers["content-length"] == "200001"


def test_media_without_length_is_chunked(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-luma", Scenario(polls_before_done=0, media_size=150_000, media_no_length=True))
    r = client.get(sb.media_url(tid))
    assert "content-length" not in r.headers and r.headers["transfer-encoding"] == "chunked"
    assert len(r.content) == 150_000


def test_large_media_streams_without_being_held_in_memory(sb: SandboxServer) -> None:
    size = 50 * 1024 * 1024
    tid = sb.add_task("replicate-training", Scenario(polls_before_done=0, media_size=size))
    digest = hashlib.sha256()
    received = 0
    tracemalloc.start()
    try:
        with httpx.stream("GET", sb.media_url(tid), timeout=60) as r:
            assert r.headers["content-length"] == str(size)
            for chunk in r.iter_bytes():
                digest.update(chunk)
                received += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert received == size
    assert digest.hexdigest() == media_digest(tid, 0, "weights", size)
    # Server and client run in this process: a 50 MB object built anywhere would show here.
    assert peak < 8 * 1024 * 1024, f"peak traced memory {peak} bytes"


def test_dubbing_audio_needs_key_language_and_completion(client: httpx.Client, sb: SandboxServer) -> None:
    tid = create(client, "elevenlabs-async", {"polls_before_done": 1, "media_size": 4096})
    audio = f"/elevenlabs/v1/dubbing/{tid}/audio/es"
    assert client.get(audio).status_code == 401
    assert poll(client, "elevenlabs-async", tid).json()["status"] == "preparing"
    # After one running poll the next poll would report dubbed, so the audio is there now.
    r = client.get(audio, headers=XI)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg" and len(r.content) == 4096
    assert client.get(f"/elevenlabs/v1/dubbing/{tid}/audio/fr", headers=XI).status_code == 404
    not_ready = sb.add_task("elevenlabs-async", Scenario(polls_before_done=2))
    r = client.get(f"/elevenlabs/v1/dubbing/{not_ready}/audio/es", headers=XI)
    assert r.status_code == 425 and r.json()["detail"]["code"] == "dubbing_not_ready"
    assert sb.media_url(tid) == f"{sb.base_url}{audio}"


# -- sync kinds ------------------------------------------------------------------------------------


def test_anthropic_message_and_errors(client: httpx.Client, sb: SandboxServer) -> None:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    r = client.post("/anthropic/v1/messages", headers=ANTH, json=body)
    assert r.status_code == 200
    msg = r.json()
    assert (
        msg["type"] == "message" and msg["content"][0]["type"] == "text" and msg["usage"]["input_tokens"] > 0
    )
    bad = client.post("/anthropic/v1/messages", headers=ANTH, json={"model": "m"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    sb.set_default_scenario(
        "anthropic-sync", Scenario(rate_limit_first=1, server_error_first=1, server_error_status=529)
    )
    throttled = client.post("/anthropic/v1/messages", headers=ANTH, json=body)
    assert throttled.status_code == 429 and throttled.headers["retry-after"] == "1"
    assert throttled.json()["error"]["type"] == "rate_limit_error"
    overloaded = client.post("/anthropic/v1/messages", headers=ANTH, json=body)
    assert overloaded.status_code == 529 and overloaded.json()["error"]["type"] == "overloaded_error"
    assert client.post("/anthropic/v1/messages", headers=ANTH, json=body).status_code == 200
    assert sb.create_count("anthropic-sync") == 2


def test_kie_chat_completions(client: httpx.Client, sb: SandboxServer) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    r = client.post("/kie/gemini-2.5-flash/v1/chat/completions", headers=BEARER, json=body)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    assert r.json()["model"] == "gemini-2.5-flash"
    failing = {**body, "sandbox_scenario": {"outcome": "fail", "error_message": "upstream model error"}}
    err = client.post("/kie/gemini-2.5-flash/v1/chat/completions", headers=BEARER, json=failing)
    assert (
        err.status_code == 200 and err.json()["code"] == 500 and err.json()["msg"] == "upstream model error"
    )
    slashed = client.post("/kie/anthropic/claude-sonnet-4/v1/chat/completions", headers=BEARER, json=body)
    assert slashed.status_code == 200 and slashed.json()["model"] == "anthropic/claude-sonnet-4"
    assert sb.create_count("kie-llm") == 3


def test_elevenlabs_tts_returns_bytes(client: httpx.Client, sb: SandboxServer) -> None:
    r = client.post(
        "/elevenlabs/v1/text-to-speech/voice123?output_format=mp3_44100_128",
        headers=XI,
        json={
            "text": "hello",
            "model_id": "eleven_multilingual_v2",
            "sandbox_scenario": {"media_size": 3000},
        },
    )
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
    assert len(r.content) == 3000 and r.content.startswith(b"ID3")
    assert client.post("/elevenlabs/v1/text-to-speech/v", headers=XI, json={}).status_code == 422
    assert sb.create_count("elevenlabs-sync") == 1


def test_seeding_a_sync_kind_is_refused(sb: SandboxServer) -> None:
    for kind in SYNC_KINDS:
        with pytest.raises(ValueError, match="synchronous"):
            sb.add_task(kind)


def test_held_open_calls_are_concurrent_and_released_by_reset(sb: SandboxServer) -> None:
    """Ten calls held open at once prove no global lock is held while a call waits."""
    sb.set_default_scenario("anthropic-sync", Scenario(outcome="run_forever"))
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    statuses: list[int] = []

    def call() -> None:
        r = httpx.post(f"{sb.api_base_url('anthropic')}/v1/messages", headers=ANTH, json=body, timeout=60)
        statuses.append(r.status_code)

    threads = [threading.Thread(target=call) for _ in range(10)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while sb.create_count("anthropic-sync") < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sb.create_count("anthropic-sync") == 10
    assert statuses == []  # all ten are inside the server, none answered
    sb.reset()
    for t in threads:
        t.join(timeout=30)
    assert statuses == [504] * 10
