"""The provider sandbox over real loopback HTTP: shapes, scenarios, errors, auth, admin, media."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from recon_dagster.core.kinds import ASYNC_KINDS, SYNC_KINDS
from recon_dagster.sandbox import SandboxServer, Scenario, ScenarioError, media_digest
from recon_dagster.sandbox.scenario import create_action, injected, poll_phase

KEY = "sandbox-key"
BEARER = {"Authorization": f"Bearer {KEY}"}
XI = {"xi-api-key": KEY}
ANTH = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


@pytest.fixture(scope="module")
def server() -> Iterator[SandboxServer]:
    with SandboxServer(api_key=KEY) as sb:
        yield sb


@pytest.fixture
def sb(server: SandboxServer) -> Iterator[SandboxServer]:
    server.reset()
    yield server


@pytest.fixture
def client(sb: SandboxServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sb.base_url, timeout=30) as c:
        yield c


# -- how to create and poll each async kind through its own API --------------------------------

CREATE: dict[str, tuple[str, dict[str, Any]]] = {
    "kie-standard": ("/kie/api/v1/jobs/createTask", {"model": "nano-banana-pro", "input": {"prompt": "p"}}),
    "kie-kling3": ("/kie/api/v1/jobs/createTask", {"model": "kling-3.0/video", "input": {"prompt": "p"}}),
    "kie-lip-sync": ("/kie/api/v1/jobs/createTask", {"model": "infinitalk/lip-sync", "input": {}}),
    "kie-veo": ("/kie/api/v1/veo/generate", {"prompt": "p", "model": "veo3_fast"}),
    "kie-suno": ("/kie/api/v1/generate", {"prompt": "p", "customMode": False, "model": "V4"}),
    "kie-kontext": ("/kie/api/v1/flux/kontext/generate", {"prompt": "p"}),
    "kie-runway": ("/kie/api/v1/runway/generate", {"prompt": "p", "duration": 5}),
    "kie-luma": ("/kie/api/v1/modify/generate", {"prompt": "p", "videoUrl": "https://x/v.mp4"}),
    "replicate-prediction": ("/replicate/v1/predictions", {"version": "abc123", "input": {"prompt": "p"}}),
    "replicate-training": (
        "/replicate/v1/models/ostris/flux-dev-lora-trainer/versions/v1/trainings",
        {"destination": "me/lora", "input": {"steps": 10}},
    ),
}

POLL = {
    "kie-standard": "/kie/api/v1/jobs/recordInfo?taskId={}",
    "kie-kling3": "/kie/api/v1/jobs/recordInfo?taskId={}",
    "kie-lip-sync": "/kie/api/v1/jobs/recordInfo?taskId={}",
    "kie-veo": "/kie/api/v1/veo/record-info?taskId={}",
    "kie-suno": "/kie/api/v1/generate/record-info?taskId={}",
    "kie-kontext": "/kie/api/v1/flux/kontext/record-info?taskId={}",
    "kie-runway": "/kie/api/v1/runway/record-detail?taskId={}",
    "kie-luma": "/kie/api/v1/modify/record-info?taskId={}",
    "replicate-prediction": "/replicate/v1/predictions/{}",
    "replicate-training": "/replicate/v1/trainings/{}",
    "elevenlabs-async": "/elevenlabs/v1/dubbing/{}",
}


def headers_for(kind: str) -> dict[str, str]:
    return XI if kind.startswith("elevenlabs") else BEARER


def create(client: httpx.Client, kind: str, scenario: dict | None = None) -> str:
    if kind == "elevenlabs-async":
        data = {"target_lang": "es", "source_lang": "en", "name": "d"}
        if scenario is not None:
            data["sandbox_scenario"] = json.dumps(scenario)
        r = client.post(
            "/elevenlabs/v1/dubbing",
            headers=XI,
            data=data,
            files={"file": ("a.mp3", b"ID3audio", "audio/mpeg")},
        )
        assert r.status_code == 200, r.text
        assert r.json()["expected_duration_sec"] > 0
        return r.json()["dubbing_id"]
    path, body = CREATE[kind]
    if scenario is not None:
        body = {**body, "sandbox_scenario": scenario}
    r = client.post(path, headers=headers_for(kind), json=body)
    if kind.startswith("replicate"):
        assert r.status_code == 201, r.text
        assert r.json()["status"] == "starting"
        return r.json()["id"]
    assert r.status_code == 200, r.text
    assert r.json()["code"] == 200
    return r.json()["data"]["taskId"]


def poll(client: httpx.Client, kind: str, task_id: str) -> httpx.Response:
    return client.get(POLL[kind].format(task_id), headers=headers_for(kind))


def state_of(kind: str, body: dict) -> Any:
    if kind.startswith("kie"):
        assert body["code"] == 200
        data = body["data"]
        for key in ("state", "successFlag", "status"):
            if key in data:
                return data[key]
    return body["status"]


def media_urls(kind: str, body: dict, sb: SandboxServer, task_id: str) -> list[str]:
    """Where each family puts its media in a succeeded poll (provider-apis.md)."""
    data = body.get("data") or {}
    if kind in ("kie-standard", "kie-kling3", "kie-lip-sync"):
        assert isinstance(data["resultJson"], str), "market resultJson is a JSON string"
        return json.loads(data["resultJson"])["resultUrls"]
    if kind in ("kie-veo", "kie-luma"):
        return data["response"]["resultUrls"]
    if kind == "kie-suno":
        return [t["audioUrl"] for t in data["response"]["sunoData"]]
    if kind == "kie-kontext":
        return [data["response"]["resultImageUrl"]]
    if kind == "kie-runway":
        return [data["videoInfo"]["videoUrl"]]
    if kind == "replicate-prediction":
        assert body["metrics"]["predict_time"] >= 0
        return body["output"]
    if kind == "replicate-training":
        assert body["output"]["version"]
        return [body["output"]["weights"]]
    assert kind == "elevenlabs-async"
    return [
        f"{sb.elevenlabs_base_url}/v1/dubbing/{task_id}/audio/{lang}" for lang in body["target_languages"]
    ]


SUCCESS = {
    "kie-standard": "success",
    "kie-kling3": "success",
    "kie-lip-sync": "success",
    "kie-veo": 1,
    "kie-suno": "SUCCESS",
    "kie-kontext": 1,
    "kie-runway": "success",
    "kie-luma": 1,
    "replicate-prediction": "succeeded",
    "replicate-training": "succeeded",
    "elevenlabs-async": "dubbed",
}
RUNNING = {
    "kie-standard": ["waiting", "queuing", "generating"],
    "kie-kling3": ["waiting", "queuing", "generating"],
    "kie-lip-sync": ["waiting", "queuing", "generating"],
    "kie-veo": [0, 0, 0],
    "kie-suno": ["PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"],
    "kie-kontext": [0, 0, 0],
    "kie-runway": ["wait", "queueing", "generating"],
    "kie-luma": [0, 0, 0],
    "replicate-prediction": ["starting", "processing", "starting"],
    "replicate-training": ["starting", "processing", "starting"],
    "elevenlabs-async": ["preparing", "dubbing", "preparing"],
}
FAILURE = {
    "kie-standard": "fail",
    "kie-kling3": "fail",
    "kie-lip-sync": "fail",
    "kie-veo": 3,
    "kie-suno": "GENERATE_AUDIO_FAILED",
    "kie-kontext": 3,
    "kie-runway": "fail",
    "kie-luma": 3,
    "replicate-prediction": "failed",
    "replicate-training": "failed",
    "elevenlabs-async": "failed",
}
CONTENT_TYPE = {
    "kie-standard": "image/png",
    "kie-kling3": "image/png",
    "kie-lip-sync": "image/png",
    "kie-veo": "video/mp4",
    "kie-suno": "audio/mpeg",
    "kie-kontext": "image/png",
    "kie-runway": "video/mp4",
    "kie-luma": "video/mp4",
    "replicate-prediction": "image/png",
    "replicate-training": "application/x-tar",
    "elevenlabs-async": "audio/mpeg",
}


def test_every_async_kind_is_covered() -> None:
    assert set(POLL) == set(ASYNC_KINDS)


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_create_poll_running_then_succeeded_then_media(
    sb: SandboxServer, client: httpx.Client, kind: str
) -> None:
    tid = create(client, kind, {"polls_before_done": 3})
    seen = [state_of(kind, poll(client, kind, tid).json()) for _ in range(3)]
    assert seen == RUNNING[kind]
    body = poll(client, kind, tid).json()
    assert state_of(kind, body) == SUCCESS[kind]
    urls = media_urls(kind, body, sb, tid)
    assert urls and all(u.startswith(sb.base_url) for u in urls)
    # Polling again after the end stays terminal.
    assert state_of(kind, poll(client, kind, tid).json()) == SUCCESS[kind]
    media = client.get(urls[0], headers=headers_for(kind))
    assert media.status_code == 200
    assert media.headers["content-type"] == CONTENT_TYPE[kind]
    assert len(media.content) == int(media.headers["content-length"]) > 0
    assert sb.create_count(kind) == 1
    assert sb.poll_count(tid) == 5
    assert sb.media_downloads(tid) == 1


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_failure_scenario_uses_documented_failure_value(
    client: httpx.Client, sb: SandboxServer, kind: str
) -> None:
    tid = sb.add_task(kind, Scenario(outcome="fail", polls_before_done=0, error_message="boom"))
    body = poll(client, kind, tid).json()
    assert state_of(kind, body) == FAILURE[kind]
    assert "boom" in json.dumps(body)


def test_market_failure_carries_fail_code_and_message(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-standard", Scenario(outcome="fail", polls_before_done=0, error_message="nsfw"))
    data = poll(client, "kie-standard", tid).json()["data"]
    assert data["failCode"] and data["failMsg"] == "nsfw" and data["resultJson"] == ""


@pytest.mark.parametrize(
    ("kind", "fail_state", "expected"),
    [
        ("kie-veo", "2", 2),
        ("kie-suno", "SENSITIVE_WORD_ERROR", "SENSITIVE_WORD_ERROR"),
        ("replicate-prediction", "aborted", "aborted"),
        ("replicate-training", "canceled", "canceled"),
    ],
)
def test_fail_state_picks_another_documented_value(
    client: httpx.Client, sb: SandboxServer, kind: str, fail_state: str, expected: Any
) -> None:
    tid = sb.add_task(kind, Scenario(outcome="fail", polls_before_done=0, fail_state=fail_state))
    assert state_of(kind, poll(client, kind, tid).json()) == expected


def test_fail_state_foreign_to_the_family_is_refused(sb: SandboxServer) -> None:
    with pytest.raises(ScenarioError, match="not a failure value of kie-veo"):
        sb.add_task("kie-veo", Scenario(outcome="fail", fail_state="failed"))


def test_luma_callback_failed_reports_success_flag_4(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-luma", Scenario(polls_before_done=0, luma_callback_failed=True))
    data = poll(client, "kie-luma", tid).json()["data"]
    assert data["successFlag"] == 4
    assert data["response"]["resultUrls"] == [sb.media_url(tid)]


def test_suno_partial_states_carry_partial_tracks(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-suno", Scenario(polls_before_done=3, media_count=2))
    assert poll(client, "kie-suno", tid).json()["data"]["response"] is None  # PENDING
    text = poll(client, "kie-suno", tid).json()["data"]["response"]["sunoData"]
    assert [t["audioUrl"] for t in text] == ["", ""]
    first = poll(client, "kie-suno", tid).json()["data"]["response"]["sunoData"]
    assert first[0]["audioUrl"] and not first[1]["audioUrl"]
    done = poll(client, "kie-suno", tid).json()["data"]
    assert done["status"] == "SUCCESS" and all(t["audioUrl"] for t in done["response"]["sunoData"])


def test_market_early_result_fills_result_json_while_waiting(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-standard", Scenario(polls_before_done=1, early_result=True))
    data = poll(client, "kie-standard", tid).json()["data"]
    assert data["state"] == "waiting" and json.loads(data["resultJson"])["resultUrls"]


def test_market_text_result_is_a_result_object(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-standard", Scenario(polls_before_done=0, media_kind="text"))
    result = json.loads(poll(client, "kie-standard", tid).json()["data"]["resultJson"])
    assert "resultObject" in result and "resultUrls" not in result


def test_replicate_output_as_string_and_media_count(client: httpx.Client, sb: SandboxServer) -> None:
    one = sb.add_task("replicate-prediction", Scenario(polls_before_done=0, output_as_string=True))
    assert poll(client, "replicate-prediction", one).json()["output"] == sb.media_url(one)
    three = sb.add_task("replicate-prediction", Scenario(polls_before_done=0, media_count=3))
    out = poll(client, "replicate-prediction", three).json()["output"]
    assert out == [sb.media_url(three, n) for n in range(3)]
    assert client.get(out[2]).status_code == 200
    assert client.get(out[2].replace("/2.png", "/3.png")).status_code == 404


def test_replicate_model_scoped_prediction_and_cancel(client: httpx.Client, sb: SandboxServer) -> None:
    r = client.post(
        "/replicate/v1/models/black-forest-labs/flux-schnell/predictions",
        headers=BEARER,
        json={"input": {"prompt": "p"}, "sandbox_scenario": {"outcome": "run_forever"}},
    )
    assert r.status_code == 201
    pred = r.json()
    assert pred["model"] == "black-forest-labs/flux-schnell"
    assert pred["urls"]["get"] == f"{sb.replicate_base_url}/predictions/{pred['id']}"
    cancel = client.post(pred["urls"]["cancel"], headers=BEARER)
    assert cancel.status_code == 200 and cancel.json()["status"] == "canceled"
    assert poll(client, "replicate-prediction", pred["id"]).json()["status"] == "canceled"


# -- unknown ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [k for k in ASYNC_KINDS if k.startswith("kie")])
def test_kie_unknown_task_is_http_200_code_422(client: httpx.Client, kind: str) -> None:
    r = poll(client, kind, "no-such-task")
    assert r.status_code == 200
    assert r.json() == {"code": 422, "msg": "recordInfo is null", "data": None}


def test_kie_task_polled_on_another_family_endpoint_is_unknown(
    client: httpx.Client, sb: SandboxServer
) -> None:
    tid = sb.add_task("kie-veo")
    assert poll(client, "kie-standard", tid).json()["code"] == 422


@pytest.mark.parametrize("kind", ["replicate-prediction", "replicate-training"])
def test_replicate_unknown_is_404_problem_json(client: httpx.Client, kind: str) -> None:
    r = poll(client, kind, "doesnotexist")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["status"] == 404 and r.json()["detail"]


def test_elevenlabs_unknown_dubbing_is_404_detail(client: httpx.Client) -> None:
    r = poll(client, "elevenlabs-async", "nope")
    assert r.status_code == 404
    detail = r.json()["detail"]
    assert {"type", "code", "message", "request_id"} <= set(detail)


# -- injected 429 / 5xx ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["kie-standard", "kie-veo", "replicate-prediction", "elevenlabs-async"])
def test_rate_limit_first_then_answers(client: httpx.Client, sb: SandboxServer, kind: str) -> None:
    tid = sb.add_task(kind, Scenario(rate_limit_first=2, polls_before_done=0, retry_after_s=3))
    for _ in range(2):
        r = poll(client, kind, tid)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "3"
    if kind.startswith("kie"):
        assert r.json()["code"] == 429
    elif kind.startswith("replicate"):
        assert r.json()["detail"].startswith("Request was throttled")
        assert r.headers["ratelimit-remaining"] == "0" and r.headers["ratelimit-reset"] == "3"
    else:
        assert r.json()["detail"]["code"] == "rate_limit_exceeded"
    ok = poll(client, kind, tid)
    assert ok.status_code == 200 and state_of(kind, ok.json()) == SUCCESS[kind]
    assert sb.poll_count(tid) == 3


@pytest.mark.parametrize(
    ("kind", "status"), [("kie-standard", 500), ("replicate-training", 503), ("elevenlabs-async", 500)]
)
def test_server_error_first_then_answers(
    client: httpx.Client, sb: SandboxServer, kind: str, status: int
) -> None:
    tid = sb.add_task(kind, Scenario(server_error_first=1, polls_before_done=0))
    assert poll(client, kind, tid).status_code == status
    assert poll(client, kind, tid).status_code == 200


def test_throttle_then_server_error_then_answer_in_order(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task(
        "kie-runway", Scenario(rate_limit_first=1, server_error_first=2, server_error_status=503)
    )
    assert [poll(client, "kie-runway", tid).status_code for _ in range(4)] == [429, 503, 503, 200]


def test_kie_errors_in_http_200_envelope(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task(
        "kie-kontext", Scenario(rate_limit_first=1, server_error_first=1, kie_http200_errors=True)
    )
    first, second = poll(client, "kie-kontext", tid), poll(client, "kie-kontext", tid)
    assert (first.status_code, first.json()["code"]) == (200, 429)
    assert (second.status_code, second.json()["code"]) == (200, 500)


def test_create_injections_throttle_fail_reject(client: httpx.Client, sb: SandboxServer) -> None:
    sb.set_default_scenario("kie-veo", Scenario(create_rate_limit_first=1, create_server_error_first=1))
    path, body = CREATE["kie-veo"]
    assert client.post(path, headers=BEARER, json=body).status_code == 429
    assert client.post(path, headers=BEARER, json=body).status_code == 500
    assert client.post(path, headers=BEARER, json=body).json()["code"] == 200
    assert sb.create_count("kie-veo") == 1
    sb.set_default_scenario(
        "kie-veo", Scenario(create_reject_status=402, error_message="Insufficient credits")
    )
    r = client.post(path, headers=BEARER, json=body)
    assert r.status_code == 200 and r.json() == {"code": 402, "msg": "Insufficient credits", "data": None}
    assert sb.create_count("kie-veo") == 1


def test_lost_create_response_still_creates_the_task(client: httpx.Client, sb: SandboxServer) -> None:
    path, body = CREATE["replicate-prediction"]
    body = {**body, "input": {"prompt": "job-7f3a"}, "sandbox_scenario": {"create_lost_response_first": 1}}
    with pytest.raises(httpx.RemoteProtocolError):
        client.post(path, headers=BEARER, json=body)
    # The provider did create (and bills) it: exactly what an ambiguous create must not repeat.
    assert sb.create_count("replicate-prediction") == 1
    assert sb.creates_for("job-7f3a") == 1
    assert client.post(path, headers=BEARER, json=body).status_code == 201
    assert sb.creates_for("job-7f3a") == 2


# -- malformed bodies ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["kie-standard", "kie-suno", "replicate-prediction", "elevenlabs-async"])
def test_malformed_truncated_is_not_json(client: httpx.Client, sb: SandboxServer, kind: str) -> None:
    tid = sb.add_task(kind, Scenario(malformed=True, polls_before_done=0))
    r = poll(client, kind, tid)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.content)


@pytest.mark.parametrize("kind", ["kie-standard", "kie-veo", "replicate-training", "elevenlabs-async"])
def test_malformed_unknown_and_missing_state(client: httpx.Client, sb: SandboxServer, kind: str) -> None:
    unknown = sb.add_task(kind, Scenario(malformed=True, malformed_kind="unknown_state"))
    state = state_of(kind, poll(client, kind, unknown).json())
    assert state in (7, "MYSTERY_STATE")
    missing = sb.add_task(kind, Scenario(malformed=True, malformed_kind="missing_state"))
    body = poll(client, kind, missing).json()
    holder = body.get("data") if kind.startswith("kie") else body
    assert not {"state", "successFlag", "status"} & set(holder)


def test_malformed_not_json_is_html(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-luma", Scenario(malformed=True, malformed_kind="not_json"))
    r = poll(client, "kie-luma", tid)
    assert r.headers["content-type"] == "text/html" and r.text.startswith("<html>")


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
        r = httpx.post(f"{sb.anthropic_base_url}/v1/messages", headers=ANTH, json=body, timeout=60)
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


# -- auth ------------------------------------------------------------------------------------------


def test_auth_rejections_have_each_providers_shape(client: httpx.Client) -> None:
    wrong = "not-the-key-SECRET123"
    kie = client.get("/kie/api/v1/jobs/recordInfo?taskId=x", headers={"Authorization": f"Bearer {wrong}"})
    assert kie.status_code == 401 and kie.json()["code"] == 401
    rep = client.get("/replicate/v1/predictions/x")
    assert rep.status_code == 401 and rep.headers["content-type"] == "application/problem+json"
    assert rep.json()["status"] == 401
    el_missing = client.get("/elevenlabs/v1/dubbing/x")
    el_wrong = client.get("/elevenlabs/v1/dubbing/x", headers={"xi-api-key": wrong})
    assert el_missing.status_code == el_wrong.status_code == 401
    assert el_missing.json()["detail"]["code"] == "missing_api_key"
    assert el_wrong.json()["detail"]["code"] == "invalid_api_key"
    an = client.post("/anthropic/v1/messages", headers={"x-api-key": wrong}, json={})
    assert an.status_code == 401 and an.json()["error"]["type"] == "authentication_error"
    # Anthropic's SDK sends its key as a Bearer token: the right one passes auth (the empty body
    # is then refused as a bad request), a wrong one is refused; no answer echoes a key.
    assert client.post("/anthropic/v1/messages", headers=BEARER, json={}).status_code == 400
    an_bearer = client.post("/anthropic/v1/messages", headers={"Authorization": f"Bearer {wrong}"}, json={})
    assert an_bearer.status_code == 401 and an_bearer.json()["error"]["type"] == "authentication_error"
    for r in (kie, rep, el_wrong, an, an_bearer):
        assert wrong not in r.text and KEY not in r.text


def test_replicate_accepts_legacy_token_scheme(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("replicate-prediction")
    assert (
        client.get(f"/replicate/v1/predictions/{tid}", headers={"Authorization": f"Token {KEY}"}).status_code
        == 200
    )


def test_repr_and_stats_do_not_show_the_key(sb: SandboxServer) -> None:
    assert KEY not in repr(sb)
    assert KEY not in json.dumps(sb.stats())


# -- bad input ---------------------------------------------------------------------------------------


def test_bad_create_bodies_get_provider_validation_errors(client: httpx.Client, sb: SandboxServer) -> None:
    kie = client.post("/kie/api/v1/jobs/createTask", headers=BEARER, content=b"{not json")
    assert kie.status_code == 200 and kie.json()["code"] == 422 and "JSON" in kie.json()["msg"]
    luma = client.post("/kie/api/v1/modify/generate", headers=BEARER, json={"prompt": "p"})
    assert luma.json()["code"] == 422 and "videoUrl" in luma.json()["msg"]
    rep = client.post("/replicate/v1/predictions", headers=BEARER, json={"input": {}})
    assert rep.status_code == 422 and "version" in rep.json()["detail"]
    bad_sc = client.post(
        "/kie/api/v1/veo/generate",
        headers=BEARER,
        json={"prompt": "p", "sandbox_scenario": {"outcome": "explode"}},
    )
    assert bad_sc.json()["code"] == 422 and "outcome" in bad_sc.json()["msg"]
    dub = client.post("/elevenlabs/v1/dubbing", headers=XI, data={"target_lang": "es"})
    assert dub.status_code == 422 and "source_url" in dub.json()["detail"]["message"]
    assert sb.create_count() == 0


def test_scenario_validation_messages() -> None:
    with pytest.raises(ScenarioError, match="polls_before_done"):
        Scenario(polls_before_done=-1)
    with pytest.raises(ScenarioError, match="unknown scenario field"):
        Scenario.from_dict({"outcome": "succeed", "pols_before_done": 1})
    with pytest.raises(ScenarioError, match="media_status"):
        Scenario(media_status=42)
    assert Scenario.from_dict(Scenario(polls_before_done=4).to_dict()) == Scenario(polls_before_done=4)


def test_market_model_routes_to_kind_and_sandbox_kind_overrides(
    client: httpx.Client, sb: SandboxServer
) -> None:
    create(client, "kie-kling3")
    create(client, "kie-lip-sync")
    r = client.post(
        "/kie/api/v1/jobs/createTask",
        headers=BEARER,
        json={"model": "x", "input": {}, "sandbox_kind": "kie-lip-sync"},
    )
    assert r.json()["code"] == 200
    assert (
        sb.create_count("kie-kling3"),
        sb.create_count("kie-lip-sync"),
        sb.create_count("kie-standard"),
    ) == (1, 2, 0)


# -- counters and admin API ------------------------------------------------------------------------


def test_counters(client: httpx.Client, sb: SandboxServer) -> None:
    path, body = CREATE["kie-standard"]
    r = client.post(path, headers=BEARER, json={**body, "callBackUrl": "https://app/cb?job=job-42"})
    tid = r.json()["data"]["taskId"]
    seeded = sb.add_task("kie-standard", Scenario(polls_before_done=0))
    poll(client, "kie-standard", tid)
    poll(client, "kie-standard", seeded)
    poll(client, "kie-standard", seeded)
    client.get(sb.media_url(seeded))
    assert sb.create_count() == sb.create_count("kie-standard") == 1
    assert sb.creates_for(tid) == 1 and sb.creates_for("job-42") == 1 and sb.creates_for(seeded) == 0
    assert (sb.poll_count(tid), sb.poll_count(seeded), sb.poll_count("other")) == (1, 2, 0)
    assert sb.media_downloads(seeded) == 1 and sb.media_downloads(tid) == 0
    assert sb.requests_total() == 5
    sb.reset()
    assert sb.requests_total() == 0 and sb.create_count() == 0 and sb.poll_count(seeded) == 0
    assert poll(client, "kie-standard", seeded).json()["code"] == 422


def test_default_scenario_applies_to_api_creates(client: httpx.Client, sb: SandboxServer) -> None:
    sb.set_default_scenario("kie-kontext", Scenario(outcome="fail", polls_before_done=0))
    tid = create(client, "kie-kontext")
    assert poll(client, "kie-kontext", tid).json()["data"]["successFlag"] == 3
    # The body's own scenario wins over the default.
    tid2 = create(client, "kie-kontext", {"polls_before_done": 0})
    assert poll(client, "kie-kontext", tid2).json()["data"]["successFlag"] == 1


def _raw(sb: SandboxServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(sb.host, sb.port, timeout=10)
    try:
        payload = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_admin_api_from_a_raw_http_client(client: httpx.Client, sb: SandboxServer) -> None:
    status, created = _raw(
        sb,
        "POST",
        "/_sandbox/tasks",
        {"kind": "kie-veo", "scenario": {"polls_before_done": 0}, "task_id": "veo-1"},
    )
    assert status == 201 and created["task_id"] == "veo-1"
    assert created["media_urls"] == [sb.media_url("veo-1")]
    assert poll(client, "kie-veo", "veo-1").json()["data"]["successFlag"] == 1
    status, _ = _raw(
        sb, "POST", "/_sandbox/default_scenario", {"kind": "kie-suno", "scenario": {"outcome": "fail"}}
    )
    assert status == 200
    suno = create(client, "kie-suno")
    status, stats = _raw(sb, "GET", f"/_sandbox/stats?task_id={suno}")
    assert status == 200
    assert stats["creates"] == {"kie-suno": 1} and stats["polls"] == {"veo-1": 1}
    assert stats["task"]["scenario"]["outcome"] == "fail" and stats["creates_for"] == 1
    status, info = _raw(sb, "GET", "/_sandbox/tasks/veo-1")
    assert status == 200 and info["answered_polls"] == 1
    status, found = _raw(sb, "GET", f"/_sandbox/creates?contains={suno}")
    assert found == {"count": 1, "task_ids": [suno]}
    assert _raw(sb, "POST", "/_sandbox/reset")[0] == 200
    assert _raw(sb, "GET", "/_sandbox/stats")[1]["tasks"] == 0


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/_sandbox/tasks", {"kind": "kie-nope"}, "unknown provider_kind"),
        ("/_sandbox/tasks", {"kind": "kie-llm"}, "synchronous"),
        ("/_sandbox/tasks", {"kind": "kie-veo", "scenario": {"bogus": 1}}, "unknown scenario field"),
        ("/_sandbox/tasks", b"[1,", "not valid JSON"),
        ("/_sandbox/default_scenario", {"kind": "kie-veo", "scenario": {"outcome": "x"}}, "outcome"),
    ],
)
def test_admin_bad_input_is_a_clear_400(sb: SandboxServer, path: str, body: Any, needle: str) -> None:
    status, answer = _raw(sb, "POST", path, body)
    assert status == 400 and needle in answer["error"]
    assert sb.stats()["tasks"] == 0


def test_admin_duplicate_task_id_is_refused(sb: SandboxServer) -> None:
    assert _raw(sb, "POST", "/_sandbox/tasks", {"kind": "kie-veo", "task_id": "same"})[0] == 201
    status, answer = _raw(sb, "POST", "/_sandbox/tasks", {"kind": "kie-veo", "task_id": "same"})
    assert status == 400 and "already exists" in answer["error"]


def test_env_points_clients_at_the_sandbox(sb: SandboxServer) -> None:
    env = sb.env()
    assert env["KIE_BASE_URL"] == f"{sb.base_url}/kie"
    assert env["REPLICATE_BASE_URL"].endswith("/replicate/v1")
    assert env["RECON_MEDIA_ALLOWED_HOSTS"] == f"127.0.0.1:{sb.port}"
    assert {
        env[k] for k in ("KIE_API_KEY", "REPLICATE_API_TOKEN", "ELEVENLABS_API_KEY", "ANTHROPIC_API_KEY")
    } == {KEY}


def test_keep_alive_connection_serves_many_requests(sb: SandboxServer) -> None:
    tid = sb.add_task("kie-standard")
    conn = http.client.HTTPConnection(sb.host, sb.port, timeout=10)
    try:
        for _ in range(20):
            conn.request("GET", f"/kie/api/v1/jobs/recordInfo?taskId={tid}", headers=BEARER)
            resp = conn.getresponse()
            assert resp.status == 200 and json.loads(resp.read())["data"]["taskId"] == tid
    finally:
        conn.close()
    assert sb.poll_count(tid) == 20


def test_busy_port_is_a_clear_error_and_restart_works(sb: SandboxServer) -> None:
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{sb.port}"):
        SandboxServer(port=sb.port).start()
    other = SandboxServer(latency_s=0.01).start()
    other.stop()
    other.start()
    try:
        tid = other.add_task("kie-standard", Scenario(polls_before_done=0))
        r = httpx.get(f"{other.kie_base_url}/api/v1/jobs/recordInfo?taskId={tid}", headers=BEARER)
        assert r.json()["data"]["state"] == "success"
    finally:
        other.stop()


# -- pure decisions ----------------------------------------------------------------------------------


def test_injected_series_order() -> None:
    assert [injected(n, 2, 1) for n in range(4)] == ["rate_limited", "rate_limited", "server_error", "answer"]


def test_poll_phase() -> None:
    assert [poll_phase(n, Scenario(polls_before_done=2)) for n in range(3)] == [
        "running",
        "running",
        "succeeded",
    ]
    assert poll_phase(0, Scenario(polls_before_done=0, outcome="fail")) == "failed"
    assert poll_phase(10_000, Scenario(outcome="run_forever")) == "running"


def test_create_action_series() -> None:
    sc = Scenario(create_rate_limit_first=1, create_server_error_first=1, create_lost_response_first=1)
    assert [create_action(n, sc) for n in range(4)] == ["rate_limited", "server_error", "lost", "create"]


# -- standalone ----------------------------------------------------------------------------------------


def test_standalone_module_serves_and_stops() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "recon_dagster.sandbox", "--port", "0", "--api-key", "operator-secret"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("recon-dagster sandbox listening on http://127.0.0.1:")
        base = first.rsplit(" ", 1)[1].strip()
        lines = [proc.stdout.readline() for _ in range(9)]
        assert "KIE_API_KEY=***\n" in lines and not any("operator-secret" in line for line in lines)
        assert httpx.get(f"{base}/_sandbox/health").json()["ok"] is True
        r = httpx.get(
            f"{base}/kie/api/v1/jobs/recordInfo?taskId=x", headers={"Authorization": "Bearer operator-secret"}
        )
        assert r.json()["code"] == 422
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
