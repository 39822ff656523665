"""How a test drives each provider's API on the sandbox by hand (raw HTTP, no client library):
per async kind, its create and poll requests, where its media are, and its documented states."""

from __future__ import annotations

import json
from typing import Any

import httpx

from recon_dagster.sandbox import SandboxServer

KEY = "sandbox-key"
BEARER = {"Authorization": f"Bearer {KEY}"}
XI = {"xi-api-key": KEY}
ANTH = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
FAL = {"Authorization": f"Key {KEY}"}


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
    # fal: the model id (with its endpoint path) is the path; the body is the model's input.
    "fal-image": ("/fal/fal-ai/flux/dev", {"prompt": "p"}),
    "fal-video": ("/fal/fal-ai/kling-video/v2/master/text-to-video", {"prompt": "p"}),
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
    "fal-image": "/fal/{}/status",
    "fal-video": "/fal/{}/status",
}


def fal_request_path(task_id: str) -> str:
    """``{owner}/{app}/requests/{request_id}`` of a fal task id (``owner:app:request_id``)."""
    app, _, request_id = task_id.rpartition(":")
    return f"{app.replace(':', '/')}/requests/{request_id}"


def headers_for(kind: str) -> dict[str, str]:
    if kind.startswith("fal"):
        return FAL
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
    if kind.startswith("fal"):
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["status_url"].endswith(f"/requests/{answer['request_id']}/status")
        app = path.removeprefix("/fal/").split("/")
        return ":".join([*app[:2], answer["request_id"]])
    if kind.startswith("replicate"):
        assert r.status_code == 201, r.text
        assert r.json()["status"] == "starting"
        return r.json()["id"]
    assert r.status_code == 200, r.text
    assert r.json()["code"] == 200
    return r.json()["data"]["taskId"]


def poll(client: httpx.Client, kind: str, task_id: str) -> httpx.Response:
    if kind.startswith("fal"):
        task_id = fal_request_path(task_id)
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
    if kind.startswith("fal"):
        # A completed status carries no output: the result is its own request.
        result = httpx.get(f"{sb.base_url}/fal/{fal_request_path(task_id)}", headers=FAL).json()
        files = result["images"] if kind == "fal-image" else [result["video"]]
        return [f["url"] for f in files]
    assert kind == "elevenlabs-async"
    return [
        f"{sb.api_base_url('elevenlabs')}/v1/dubbing/{task_id}/audio/{lang}"
        for lang in body["target_languages"]
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
    "fal-image": "COMPLETED",
    "fal-video": "COMPLETED",
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
    "fal-image": ["IN_QUEUE", "IN_PROGRESS", "IN_PROGRESS"],
    "fal-video": ["IN_QUEUE", "IN_PROGRESS", "IN_PROGRESS"],
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
    # fal reports a failure as COMPLETED with an error.
    "fal-image": "COMPLETED",
    "fal-video": "COMPLETED",
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
    "fal-image": "image/png",
    "fal-video": "video/mp4",
}
