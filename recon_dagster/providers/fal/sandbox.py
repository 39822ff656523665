"""fal's queue in the loopback sandbox: submit, status, result and cancel under ``/fal/``, fal's
error shape (``detail`` + ``error_type`` and the ``X-Fal-Error-Type`` header), ``Authorization:
Key``, and the results' files on the sandbox's media host (fal's CDN stands in for it).

Loaded by the sandbox by name (``SPEC.sandbox``); the routes follow the stored queue reference:
status/result/cancel at the app (``{owner}/{app}``), never at a model's endpoint path. A model id
that names video (``.../kling-video/...``) is a ``fal-video`` task, any other a ``fal-image`` one.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

from recon_dagster.providers.fal.ids import APP_NAMESPACES, app_of, task_id_for
from recon_dagster.providers.fal.spec import NAME, SPEC, FalFamily
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.media import MEDIA_TYPES
from recon_dagster.sandbox.plugins import PluginFamily, SandboxPlugin
from recon_dagster.sandbox.refusals import json_body, requested_scenario
from recon_dagster.sandbox.scenario import media_kind_for, poll_phase
from recon_dagster.sandbox.shapes import Links
from recon_dagster.sandbox.state import PollTicket, Task
from recon_dagster.sandbox.wire import Request, Response, json_response

PREFIX = f"/{NAME}"
_APP = r"(?P<app>(?:(?:" + "|".join(APP_NAMESPACES) + r")/)?[^/]+/[^/]+)"
_RE_STATUS = re.compile(rf"^{PREFIX}/(?P<path>.+)/requests/(?P<rid>[^/]+)/status$")
_RE_RESULT = re.compile(rf"^{PREFIX}/(?P<path>.+)/requests/(?P<rid>[^/]+)$")
_RE_CANCEL = re.compile(rf"^{PREFIX}/(?P<path>.+)/requests/(?P<rid>[^/]+)/cancel$")
_RE_APP = re.compile(rf"^{_APP}$")
# fal's error types the sandbox can fail a request with (the first is the default).
FAIL_TYPES = ("internal_server_error", "generation_timeout", "content_policy_violation")
CANCELLED_TYPE = "request_cancelled"  # how the sandbox reports a cancelled request's status
_FAMILIES = tuple(FalFamily)


def _is_submit(path: str) -> bool:
    return path.startswith(PREFIX + "/") and "/requests/" not in path and path.count("/") >= 3


def _kind_of(model: str) -> str:
    return FalFamily.VIDEO if "video" in model.lower() else FalFamily.IMAGE


def _error(
    status: int, error_type: str, message: str, headers: Mapping[str, str], delay_s: float
) -> Response:
    body = {"detail": message, "error_type": error_type}
    return json_response(status, body, {**headers, "X-Fal-Error-Type": error_type}, delay_s=delay_s)


def _urls(base: str, app: str, request_id: str) -> dict[str, str]:
    root = f"{base}{PREFIX}/{app}/requests/{request_id}"
    return {"response_url": root, "status_url": f"{root}/status", "cancel_url": f"{root}/cancel"}


def submit(sb: SandboxCore, req: Request) -> Response:
    model = req.path[len(PREFIX) + 1 :]
    try:
        app = app_of(model)
    except ValueError as exc:
        return _error(404, "not_found", str(exc), {}, 0.0)
    body = dict(json_body(req, NAME))
    requested = requested_scenario(body.pop("sandbox_scenario", None), NAME)
    kind = _kind_of(model)
    sc = sb.scenario_for(kind, requested, NAME)
    action, refusal = sb.create_gate(NAME, kind, sc)
    if refusal is not None:
        return refusal
    request_id = str(uuid.uuid4())
    task = sb.state.add_task(
        kind, sc, task_id_for(app, request_id), via_create=True, model=model, input=body,
        meta={"lifecycle": req.headers.get("X-Fal-Object-Lifecycle-Preference")},
    )  # fmt: skip
    sb.state.record_create(kind, task.task_id, req.body)
    delay = sb.latency(sc)
    if action == "lost":
        return Response(0, drop=True, delay_s=delay)
    answer = {"request_id": request_id, **_urls(sb.base_url, app, request_id), "queue_position": 0}
    return json_response(200, answer, delay_s=delay)


def _ticket(
    sb: SandboxCore, pattern: re.Pattern[str], req: Request, *, poll: bool, missing: Response | None = None
) -> PollTicket | Response:
    """The request addressed by ``req`` (counted as a poll or as another request), or the answer
    that refuses it: a path that is not an app's, an unknown request, an injected 429/5xx."""
    match = pattern.match(req.path)
    assert match is not None
    if _RE_APP.match(match["path"]) is None:
        return _error(404, "not_found", f"{match['path']!r} is not an app id: use '<owner>/<app>'", {}, 0.0)
    task_id = task_id_for(match["path"], match["rid"])
    ticket = sb.state.poll(task_id, _FAMILIES) if poll else sb.state.task_request(task_id, _FAMILIES)
    if ticket is None:
        return missing or _error(404, "not_found", "Request not found", {}, 0.0)
    return sb.ticket_response(ticket, NAME) or ticket


def status(sb: SandboxCore, req: Request) -> Response:
    ticket = _ticket(sb, _RE_STATUS, req, poll=True)
    if isinstance(ticket, Response):
        return ticket
    return sb.answer_poll(ticket.task, ticket.answered_index, NAME, req)


def result(sb: SandboxCore, req: Request) -> Response:
    ticket = _ticket(sb, _RE_RESULT, req, poll=False)
    if isinstance(ticket, Response):
        return ticket
    task = ticket.task
    sc = task.scenario
    delay = sb.latency(sc)
    phase = poll_phase(task.answered, sc)
    if task.canceled:
        return _error(400, CANCELLED_TYPE, "Request was cancelled", {}, delay)
    if phase == "running":
        return _error(400, "request_in_progress", "Request is still in progress", {}, delay)
    if phase == "failed":
        error_type = sc.fail_state or FAIL_TYPES[0]
        return _error(500, error_type, sc.error_message or "Generation failed", {}, delay)
    if sc.data_removed:
        return _error(404, "not_found", "Request payload expired", {}, delay)
    return json_response(200, output(task, sb.links(task)), delay_s=delay)


def cancel(sb: SandboxCore, req: Request) -> Response:
    ticket = _ticket(sb, _RE_CANCEL, req, poll=False, missing=json_response(404, {"status": "NOT_FOUND"}))
    if isinstance(ticket, Response):
        return ticket
    task = ticket.task
    delay = sb.latency(task.scenario)
    if task.canceled or poll_phase(task.answered, task.scenario) != "running":
        return json_response(400, {"status": "ALREADY_COMPLETED"}, delay_s=delay)
    sb.state.cancel(task)
    return json_response(202, {"status": "CANCELLATION_REQUESTED"}, delay_s=delay)


def _file(url: str, kind: str) -> dict[str, Any]:
    ext, ctype = MEDIA_TYPES[kind]
    return {"url": url, "content_type": ctype, "file_name": f"output.{ext}", "file_size": None}


def output(task: Task, links: Links) -> dict[str, Any]:
    """A completed request's result: ``images`` for an image model, ``video`` for a video one."""
    kind = media_kind_for(task.family, task.scenario)
    files = [_file(url, kind) for url in links.media]
    if task.family == FalFamily.VIDEO:
        return {"video": files[0]}
    return {"images": files, "seed": 42, "has_nsfw_concepts": [False] * len(files)}


def render_status(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    """A status answer: ``IN_QUEUE`` (first poll), ``IN_PROGRESS``, then ``COMPLETED``."""
    body: dict[str, Any] = {"request_id": task.task_id.rpartition(":")[2], "logs": None}
    if task.canceled:
        return {**body, "status": "COMPLETED", "error": "Request was cancelled", "error_type": CANCELLED_TYPE}
    if phase == "running":
        if i == 0:
            return {**body, "status": "IN_QUEUE", "queue_position": 0}
        return {**body, "status": "IN_PROGRESS"}
    body.update(status="COMPLETED", metrics={"inference_time": 1.25})
    if phase == "failed":
        sc = task.scenario
        body.update(error=sc.error_message or "Generation failed", error_type=sc.fail_state or FAIL_TYPES[0])
    return body


def _family(media: str) -> PluginFamily:
    return PluginFamily(
        media_kind=media, fail_states=FAIL_TYPES, running_values=("IN_QUEUE", "IN_PROGRESS"),
        state_path=("status",), render=render_status, new_task_id=lambda: task_id_for("fal-ai/sandbox", str(uuid.uuid4())),
    )  # fmt: skip


def _presented_key(req: Request) -> str | None:
    scheme, _, token = (req.headers.get("Authorization") or "").partition(" ")
    return (token.strip() or None) if scheme == "Key" else None


SANDBOX = SandboxPlugin(
    provider=NAME,
    routes=(
        Route("POST", _is_submit, submit, create=True),
        Route("GET", _RE_STATUS.match, status),
        Route("PUT", _RE_CANCEL.match, cancel),
        Route("GET", _RE_RESULT.match, result),
    ),
    presented_key=_presented_key,
    error=_error,
    families={FalFamily.IMAGE: _family("image"), FalFamily.VIDEO: _family("video")},
    env=lambda base_url, key: {SPEC.settings.base_url_env: base_url, SPEC.settings.key_env: key},
)
