"""KIE's answers in the sandbox: its envelope and error body, its refusals (an error may come as
HTTP 200 with the status in the envelope's ``code``), and the poll bodies of its task families."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from recon_dagster.providers.kie.spec import KieFamily
from recon_dagster.sandbox import shapes
from recon_dagster.sandbox.refusals import Refusals
from recon_dagster.sandbox.scenario import Scenario
from recon_dagster.sandbox.shapes import Links, iso_time, ms_time
from recon_dagster.sandbox.state import Task
from recon_dagster.sandbox.wire import Json, Response, json_response


def kie_time(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def kie_envelope(data: Any, code: int = 200, msg: str = "success", msg_key: str = "msg") -> dict[str, Any]:
    return {"code": code, msg_key: msg, "data": data}


def kie_error(code: int, msg: str) -> dict[str, Any]:
    return {"code": code, "msg": msg, "data": None}


class KieRefusals(Refusals):
    """KIE's refusals: its error envelope; throttling and server errors may come as HTTP 200
    (``kie_http200_errors``) with the status in the envelope's ``code``."""

    def unauthorized(self, missing: bool) -> Response:
        return json_response(401, kie_error(401, "You do not have access permissions"))

    def echo_key(self, message: str, delay_s: float) -> Response:
        return json_response(200, kie_error(401, message), delay_s=delay_s)

    def throttled(self, sc: Scenario, delay_s: float) -> Response:
        status = 200 if sc.http200_errors else 429
        body: Json = kie_error(429, "Rate limited: too many requests, please retry later")
        return json_response(status, body, {"Retry-After": str(sc.retry_after_s)}, delay_s=delay_s)

    def server_error(self, sc: Scenario, delay_s: float) -> Response:
        status = sc.server_error_status or 500
        http = 200 if sc.http200_errors else status
        body: Json = kie_error(status, "Server error, please try again later")
        return json_response(http, body, delay_s=delay_s)

    def invalid(self, message: str) -> Response:
        return json_response(200, kie_error(422, message))

    def not_found(self, message: str) -> Response:
        return json_response(404, kie_error(404, message))

    def rejected(self, status: int, message: str, delay_s: float) -> Response:
        return json_response(200, kie_error(status, message), delay_s=delay_s)

    def timed_out(self) -> Response:
        return json_response(504, kie_error(504, "Request timed out"))


def _param_json(task: Task) -> str:
    return json.dumps(task.input or {"prompt": "sandbox"})


def render_market(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
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
        "createTime": ms_time(task.created_at),
        "updateTime": ms_time(time.time()),
    }
    if phase == "running":
        data["state"] = shapes.running_value(task.family, i)
        if sc.early_result:
            data["resultJson"] = result
    elif phase == "succeeded":
        data.update(state="success", resultJson=result)
    else:
        data.update(state="fail", failCode="500", failMsg=sc.error_message or shapes.DEFAULT_ERROR)
    if phase != "running":
        data["completeTime"] = ms_time(task.completed_at)
        data["costTime"] = int(((task.completed_at or task.created_at) - task.created_at) * 1000)
    # recordInfo's documented envelope says "message" where others say "msg".
    return kie_envelope(data, msg_key="message")


def _flag_family(task: Task, phase: str, i: int) -> tuple[Any, Any, Any]:
    """(successFlag, errorCode, errorMessage) for the successFlag families."""
    sc = task.scenario
    if phase == "running":
        return shapes.running_value(task.family, i), None, ""
    if phase == "succeeded":
        flag = 4 if (task.family == KieFamily.LUMA and sc.luma_callback_failed) else 1
        return flag, None, ""
    flag = shapes.fail_value(task.family, sc)
    return flag, (400 if flag == 2 else 501), sc.error_message or shapes.DEFAULT_ERROR


def _flag_data(
    task: Task, phase: str, i: int, response: Any, clock: Callable[[float | None], Any]
) -> dict[str, Any]:
    """Veo's and Kontext's record (the same fields in the same order; each its own time format)."""
    flag, code, message = _flag_family(task, phase, i)
    return {
        "taskId": task.task_id,
        "paramJson": _param_json(task),
        "completeTime": clock(task.completed_at) if phase != "running" else None,
        "response": response,
        "successFlag": flag,
        "errorCode": code,
        "errorMessage": message,
        "createTime": clock(task.created_at),
    }


def render_veo(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    response = None
    if phase == "succeeded":
        response = {"taskId": task.task_id, "resultUrls": list(links.media), "resolution": "1080p"}
    return kie_envelope({**_flag_data(task, phase, i, response, kie_time), "fallbackFlag": False})


def render_kontext(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    response = None
    if phase == "succeeded":
        response = {"originImageUrl": None, "resultImageUrl": links.media[0]}
    return kie_envelope(_flag_data(task, phase, i, response, iso_time))


def render_luma(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    flag, code, message = _flag_family(task, phase, i)
    response = None
    if phase == "succeeded":
        response = {"taskId": task.task_id, "originUrls": [], "resultUrls": list(links.media)}
    data = {
        "taskId": task.task_id,
        "paramJson": _param_json(task),
        "completeTime": ms_time(task.completed_at) if phase != "running" else None,
        "response": response,
        "successFlag": flag,
        "createTime": ms_time(task.created_at),
        "errorCode": code,
        "errorMessage": message or None,
    }
    return kie_envelope(data)


def render_suno(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    sc = task.scenario
    status = shapes.running_value(task.family, i) if phase == "running" else None
    if phase == "succeeded":
        status = "CALLBACK_EXCEPTION" if sc.suno_callback_failed else "SUCCESS"
    elif phase == "failed":
        status = shapes.fail_value(task.family, sc)

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
            "createTime": kie_time(task.created_at),
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
        "errorMessage": (sc.error_message or shapes.DEFAULT_ERROR) if failed else None,
    }
    return kie_envelope(data)


def render_runway(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    sc = task.scenario
    video_info = None
    if phase == "succeeded":
        video_info = {
            "videoId": f"{task.task_id[:8]}-video",
            "taskId": task.task_id,
            "videoUrl": links.media[0],
            "imageUrl": links.covers[0],
        }
    state = {"succeeded": "success", "failed": "fail"}.get(phase) or shapes.running_value(task.family, i)
    data = {
        "taskId": task.task_id,
        "parentTaskId": "",
        "generateParam": {
            "prompt": (task.input or {}).get("prompt", "sandbox"),
            "imageUrl": (task.input or {}).get("imageUrl", ""),
            "expandPrompt": True,
        },
        "state": state,
        "generateTime": kie_time(task.created_at),
        "videoInfo": video_info,
        "failCode": 400 if phase == "failed" else "",
        "failMsg": (sc.error_message or shapes.DEFAULT_ERROR) if phase == "failed" else "",
        "expireFlag": 1 if (phase == "succeeded" and sc.expired) else 0,
    }
    return kie_envelope(data)


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
