"""Response bodies in each provider's own shape (provider-apis.md), as pure functions of a task."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from recon_dagster.sandbox.families import Family
from recon_dagster.sandbox.scenario import FAMILY_FAIL_STATES, Scenario
from recon_dagster.sandbox.state import Task

# Documented non-terminal values; successive running polls rotate through them.
RUNNING_VALUES: dict[str, tuple[Any, ...]] = {
    Family.KIE_MARKET: ("waiting", "queuing", "generating"),
    Family.KIE_VEO: (0,),
    Family.KIE_SUNO: ("PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"),
    Family.KIE_KONTEXT: (0,),
    Family.KIE_LUMA: (0,),
    Family.KIE_RUNWAY: ("wait", "queueing", "generating"),
    Family.REPLICATE_PREDICTION: ("starting", "processing"),
    Family.REPLICATE_TRAINING: ("starting", "processing"),
    Family.ELEVENLABS_DUBBING: ("preparing", "dubbing"),
}

# Where each family's state field lives in a poll body (used to build malformed bodies).
STATE_PATH: dict[str, tuple[str, ...]] = {
    Family.KIE_MARKET: ("data", "state"),
    Family.KIE_VEO: ("data", "successFlag"),
    Family.KIE_SUNO: ("data", "status"),
    Family.KIE_KONTEXT: ("data", "successFlag"),
    Family.KIE_LUMA: ("data", "successFlag"),
    Family.KIE_RUNWAY: ("data", "state"),
    Family.REPLICATE_PREDICTION: ("status",),
    Family.REPLICATE_TRAINING: ("status",),
    Family.ELEVENLABS_DUBBING: ("status",),
}

KIE_FAMILIES = (
    Family.KIE_MARKET,
    Family.KIE_VEO,
    Family.KIE_SUNO,
    Family.KIE_KONTEXT,
    Family.KIE_LUMA,
    Family.KIE_RUNWAY,
)

DEFAULT_ERROR = "Generation failed, please try again later"
SANDBOX_VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"


def running_value(family: str, index: int) -> Any:
    values = RUNNING_VALUES[family]
    return values[index % len(values)]


def fail_value(family: str, scenario: Scenario) -> Any:
    """The scenario's failure value, typed as the provider sends it (flags are integers)."""
    value = scenario.fail_state or FAMILY_FAIL_STATES[family][0]
    return int(value) if value.isdigit() else value


# -- times in each provider's format ---------------------------------------------------------


def _ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def _kie_dt(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- envelopes and error bodies --------------------------------------------------------------


def kie_envelope(data: Any, code: int = 200, msg: str = "success", msg_key: str = "msg") -> dict[str, Any]:
    return {"code": code, msg_key: msg, "data": data}


def kie_error(code: int, msg: str) -> dict[str, Any]:
    return {"code": code, "msg": msg, "data": None}


def replicate_problem(status: int, title: str, detail: str) -> dict[str, Any]:
    return {"title": title, "detail": detail, "status": status}


def elevenlabs_error(type_: str, code: str, message: str) -> dict[str, Any]:
    return {
        "detail": {
            "type": type_,
            "code": code,
            "message": message,
            "request_id": secrets.token_hex(12),
        }
    }


def anthropic_error(type_: str, message: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": type_, "message": message},
        "request_id": "req_" + secrets.token_hex(12),
    }


# -- poll bodies -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Links:
    """Where a task's media and API objects live on this sandbox."""

    media: tuple[str, ...]
    covers: tuple[str, ...]
    replicate_base: str


def register_renderer(family: str, render: Callable[[Task, str, int, Links], dict[str, Any]]) -> None:
    """A plugin family's poll body (``sandbox/plugins.py``)."""
    _RENDERERS[family] = render


def poll_body(task: Task, phase: str, running_index: int, links: Links) -> dict[str, Any]:
    """The body a poll of ``task`` answers in ``phase`` (running/succeeded/failed)."""
    renderer = _RENDERERS[task.family]
    return renderer(task, phase, running_index, links)


def _param_json(task: Task) -> str:
    return json.dumps(task.input or {"prompt": "sandbox"})


def _kie_market(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    sc = task.scenario
    if sc.media_kind == "text":
        result = json.dumps({"resultObject": {"text": "sandbox text result"}})
    else:
        result = json.dumps({"resultUrls": list(links.media)})
    data: dict[str, Any] = {
        "taskId": task.task_id,
        "model": task.model or "google/nano-banana",
        "state": "",
        "param": json.dumps({"model": task.model, "input": task.input}),
        "resultJson": "",
        "failCode": "",
        "failMsg": "",
        "costTime": 0,
        "completeTime": None,
        "createTime": _ms(task.created_at),
        "updateTime": _ms(time.time()),
    }
    if phase == "running":
        data["state"] = running_value(task.family, i)
        if sc.early_result:
            data["resultJson"] = result
    elif phase == "succeeded":
        data.update(state="success", resultJson=result)
    else:
        data.update(state="fail", failCode="500", failMsg=sc.error_message or DEFAULT_ERROR)
    if phase != "running":
        data["completeTime"] = _ms(task.completed_at)
        data["costTime"] = int(((task.completed_at or task.created_at) - task.created_at) * 1000)
    # recordInfo's documented envelope says "message" where others say "msg".
    return kie_envelope(data, msg_key="message")


def _flag_family(task: Task, phase: str, i: int) -> tuple[Any, Any, Any]:
    """(successFlag, errorCode, errorMessage) for the successFlag families."""
    sc = task.scenario
    if phase == "running":
        return running_value(task.family, i), None, ""
    if phase == "succeeded":
        flag = 4 if (task.family == Family.KIE_LUMA and sc.luma_callback_failed) else 1
        return flag, None, ""
    flag = fail_value(task.family, sc)
    return flag, (400 if flag == 2 else 501), sc.error_message or DEFAULT_ERROR


def _kie_veo(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    flag, code, message = _flag_family(task, phase, i)
    response = None
    if phase == "succeeded":
        response = {
            "taskId": task.task_id,
            "resultUrls": list(links.media),
            "resolution": "1080p",
        }
    data = {
        "taskId": task.task_id,
        "paramJson": _param_json(task),
        "completeTime": _kie_dt(task.completed_at) if phase != "running" else None,
        "response": response,
        "successFlag": flag,
        "errorCode": code,
        "errorMessage": message,
        "createTime": _kie_dt(task.created_at),
        "fallbackFlag": False,
    }
    return kie_envelope(data)


def _kie_kontext(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    flag, code, message = _flag_family(task, phase, i)
    response = None
    if phase == "succeeded":
        response = {"originImageUrl": None, "resultImageUrl": links.media[0]}
    data = {
        "taskId": task.task_id,
        "paramJson": _param_json(task),
        "completeTime": _iso(task.completed_at) if phase != "running" else None,
        "response": response,
        "successFlag": flag,
        "errorCode": code,
        "errorMessage": message,
        "createTime": _iso(task.created_at),
    }
    return kie_envelope(data)


def _kie_luma(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    flag, code, message = _flag_family(task, phase, i)
    response = None
    if phase == "succeeded":
        response = {"taskId": task.task_id, "originUrls": [], "resultUrls": list(links.media)}
    data = {
        "taskId": task.task_id,
        "paramJson": _param_json(task),
        "completeTime": _ms(task.completed_at) if phase != "running" else None,
        "response": response,
        "successFlag": flag,
        "createTime": _ms(task.created_at),
        "errorCode": code,
        "errorMessage": message or None,
    }
    return kie_envelope(data)


def _kie_suno(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    sc = task.scenario
    status = running_value(task.family, i) if phase == "running" else None
    if phase == "succeeded":
        status = "CALLBACK_EXCEPTION" if sc.suno_callback_failed else "SUCCESS"
    elif phase == "failed":
        status = fail_value(task.family, sc)

    def track(n: int, done: bool) -> dict[str, Any]:
        return {
            "id": f"{task.task_id[:8]}-{n:04d}-sandbox",
            "audioUrl": links.media[n] if done else "",
            "streamAudioUrl": f"{links.media[n]}?stream=1",
            "imageUrl": links.covers[n],
            "prompt": (task.input or {}).get("prompt", "sandbox"),
            "modelName": "chirp-v4",
            "title": "Sandbox Track",
            "tags": "sandbox",
            "createTime": _kie_dt(task.created_at),
            "duration": 12.5,
        }

    response = None
    count = len(links.media)
    # Partial results arrive before SUCCESS: clients must branch on status, not on URLs.
    if status == "TEXT_SUCCESS":
        response = {"taskId": task.task_id, "sunoData": [track(n, False) for n in range(count)]}
    elif status == "FIRST_SUCCESS":
        response = {
            "taskId": task.task_id,
            "sunoData": [track(n, n == 0) for n in range(count)],
        }
    elif phase == "succeeded":
        response = {"taskId": task.task_id, "sunoData": [track(n, True) for n in range(count)]}
    failed = phase == "failed"
    data = {
        "taskId": task.task_id,
        "parentMusicId": "",
        "param": _param_json(task),
        "response": response,
        "status": status,
        "type": "GENERATE",
        "errorCode": 500 if failed else None,
        "errorMessage": (sc.error_message or DEFAULT_ERROR) if failed else None,
    }
    return kie_envelope(data)


def _kie_runway(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    sc = task.scenario
    video_info = None
    if phase == "succeeded":
        video_info = {
            "videoId": f"{task.task_id[:8]}-video",
            "taskId": task.task_id,
            "videoUrl": links.media[0],
            "imageUrl": links.covers[0],
        }
    state = {"succeeded": "success", "failed": "fail"}.get(phase) or running_value(task.family, i)
    data = {
        "taskId": task.task_id,
        "parentTaskId": "",
        "generateParam": {
            "prompt": (task.input or {}).get("prompt", "sandbox"),
            "imageUrl": (task.input or {}).get("imageUrl", ""),
            "expandPrompt": True,
        },
        "state": state,
        "generateTime": _kie_dt(task.created_at),
        "videoInfo": video_info,
        "failCode": 400 if phase == "failed" else "",
        "failMsg": (sc.error_message or DEFAULT_ERROR) if phase == "failed" else "",
        "expireFlag": 1 if (phase == "succeeded" and sc.expired) else 0,
    }
    return kie_envelope(data)


def _replicate(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    sc = task.scenario
    training = task.family == Family.REPLICATE_TRAINING
    collection = "trainings" if training else "predictions"
    get_url = f"{links.replicate_base}/{collection}/{task.task_id}"
    status: str
    output: Any = None
    error: str | None = None
    if task.canceled:
        status = "canceled"
    elif phase == "running":
        status = running_value(task.family, i)
    elif phase == "succeeded":
        status = "succeeded"
        if not sc.data_removed:
            if training:
                output = {
                    "version": f"sandbox/trained:{task.task_id}",
                    "weights": links.media[0],
                }
            elif sc.output_as_string:
                output = links.media[0]
            else:
                output = list(links.media)
    else:
        status = fail_value(task.family, sc)
        if status == "failed":
            error = (
                sc.error_message
                or f"{'Training' if training else 'Prediction'} failed: sandbox model raised an error"
            )
    done = status in ("succeeded", "failed", "canceled", "aborted")
    body: dict[str, Any] = {
        "id": task.task_id,
        "model": task.model or ("sandbox/trainer" if training else "sandbox/model"),
        "version": task.meta.get("version", SANDBOX_VERSION),
        "input": task.input,
        "logs": "sandbox: done\n" if done else "sandbox: working\n",
        "output": output,
        "data_removed": bool(done and status == "succeeded" and sc.data_removed),
        "error": error,
        "status": status,
        "source": "api",
        "created_at": _iso(task.created_at),
        "started_at": _iso(task.started_at) if status != "starting" else None,
        "completed_at": _iso(task.completed_at) if done else None,
        "urls": {"get": get_url, "cancel": f"{get_url}/cancel"},
        "metrics": {},
    }
    if done and status == "succeeded":
        start = task.started_at or task.created_at
        # A task seeded with its compute seconds (meta "predict_time") reports them, as billed.
        seconds = task.meta.get("predict_time", round((task.completed_at or start) - start, 3))
        body["metrics"] = {"predict_time": seconds, **({"total_time": seconds} if training else {})}
    return body


def _elevenlabs_dubbing(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    sc = task.scenario
    status = {"succeeded": "dubbed", "failed": "failed"}.get(phase) or running_value(task.family, i)
    body: dict[str, Any] = {
        "dubbing_id": task.task_id,
        "name": task.meta.get("name", "sandbox dub"),
        "status": status,
        "source_language": task.meta.get("source_lang", "en"),
        "target_languages": list(task.target_languages),
        "editable": False,
        "created_at": _iso(task.created_at),
        "media_metadata": {"content_type": "audio/mpeg", "duration": 12.5},
    }
    if phase == "failed":
        body["error"] = sc.error_message or "Dubbing failed"
    return body


_RENDERERS: dict[str, Callable[[Task, str, int, Links], dict[str, Any]]] = {
    Family.KIE_MARKET: _kie_market,
    Family.KIE_VEO: _kie_veo,
    Family.KIE_SUNO: _kie_suno,
    Family.KIE_KONTEXT: _kie_kontext,
    Family.KIE_LUMA: _kie_luma,
    Family.KIE_RUNWAY: _kie_runway,
    Family.REPLICATE_PREDICTION: _replicate,
    Family.REPLICATE_TRAINING: _replicate,
    Family.ELEVENLABS_DUBBING: _elevenlabs_dubbing,
}


def malformed_body(family: str, body: dict[str, Any], how: str) -> bytes:
    """Spoil a poll body the way a misbehaving upstream or proxy would."""
    if how == "not_json":
        return b"<html><body><h1>502 Bad Gateway</h1></body></html>"
    valid = json.dumps(body).encode()
    if how == "truncated":
        return valid[: max(1, len(valid) // 2)]
    spoiled = json.loads(valid)
    holder = spoiled
    path = STATE_PATH[family]
    for key in path[:-1]:
        holder = holder[key]
    if how == "missing_state":
        holder.pop(path[-1], None)
    else:  # unknown_state
        holder[path[-1]] = 7 if isinstance(holder.get(path[-1]), int) else "MYSTERY_STATE"
    return json.dumps(spoiled).encode()


# -- sync call bodies ------------------------------------------------------------------------


def anthropic_message(model: str, text: str, input_tokens: int) -> dict[str, Any]:
    return {
        "id": "msg_" + secrets.token_hex(12),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": len(text.split())},
    }


def chat_completion(model: str, text: str, prompt_tokens: int) -> dict[str, Any]:
    completion_tokens = len(text.split())
    return {
        "id": "chatcmpl-" + secrets.token_hex(12),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
