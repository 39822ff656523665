"""The key-less JSON admin API under ``/_sandbox/``: how other processes steer and read the sandbox."""

from __future__ import annotations

import json
import re

from recon_dagster.core.kinds import get_kind
from recon_dagster.sandbox.core import SandboxCore
from recon_dagster.sandbox.scenario import Scenario, ScenarioError
from recon_dagster.sandbox.state import max_in_window
from recon_dagster.sandbox.wire import BadRequest, Json, Request, Response, json_response

_RE_ADMIN_TASK = re.compile(r"^/_sandbox/tasks/(?P<id>[^/]+)$")


def answer(sb: SandboxCore, req: Request) -> Response:
    path, method = req.path, req.method
    try:
        if path == "/_sandbox/health" and method == "GET":
            return json_response(200, {"ok": True, "base_url": sb.base_url})
        if path == "/_sandbox/stats" and method == "GET":
            return json_response(200, sb.state.stats(req.q("task_id")))
        if path == "/_sandbox/reset" and method == "POST":
            sb.reset()
            return json_response(200, {"ok": True})
        if path == "/_sandbox/tasks" and method == "POST":
            body = _admin_body(req)
            kind = body.get("kind")
            get_kind(kind)
            scenario = Scenario.from_dict(body.get("scenario"))
            task = sb.state.add_task(str(kind), scenario, body.get("task_id"))
            return json_response(
                201, {"task_id": task.task_id, "kind": kind, "media_urls": sb.media_urls(task)}
            )
        match = _RE_ADMIN_TASK.match(path)
        if match and method == "GET":
            found = sb.state.get(match["id"])
            if found is None:
                return json_response(404, {"error": f"no sandbox task {match['id']!r}"})
            return json_response(200, {**found.info(), "media_urls": sb.media_urls(found)})
        if path == "/_sandbox/default_scenario" and method == "POST":
            body = _admin_body(req)
            kind = body.get("kind")
            get_kind(kind)
            raw = body.get("scenario")
            sb.state.set_default(str(kind), None if raw is None else Scenario.from_dict(raw))
            return json_response(200, {"ok": True})
        if path == "/_sandbox/requests" and method == "GET":
            window = req.q("window_s")
            stamps = sb.state.request_times(req.q("provider"), req.q("op"), float(req.q("since") or 0))
            body = {"count": len(stamps), "timestamps": stamps}
            if window:
                body["max_in_window"] = max_in_window(stamps, float(window))
            return json_response(200, body)
        if path == "/_sandbox/creates" and method == "GET":
            contains = req.q("contains")
            if not contains:
                return json_response(400, {"error": "query parameter 'contains' is required"})
            ids = sb.state.create_task_ids(contains)
            return json_response(200, {"count": sb.state.creates_for(contains), "task_ids": ids})
    except (ValueError, ScenarioError) as exc:
        return json_response(400, {"error": str(exc)})
    return json_response(404, {"error": f"no admin endpoint {method} {path}; see recon_dagster.sandbox"})


def _admin_body(req: Request) -> Json:
    try:
        data = json.loads(req.body or b"{}")
    except ValueError as exc:
        raise BadRequest(json_response(400, {"error": f"body is not valid JSON: {exc}"})) from None
    if not isinstance(data, dict):
        raise BadRequest(json_response(400, {"error": "body must be a JSON object"}))
    return data
