"""ElevenLabs' answers in the sandbox: its ``detail`` error body, its refusals, its dubbing body."""

from __future__ import annotations

import secrets
from typing import Any

from recon_dagster.sandbox import shapes
from recon_dagster.sandbox.refusals import Refusals
from recon_dagster.sandbox.scenario import Scenario
from recon_dagster.sandbox.shapes import Links, iso_time
from recon_dagster.sandbox.state import Task
from recon_dagster.sandbox.wire import Response, json_response


def elevenlabs_error(type_: str, code: str, message: str) -> dict[str, Any]:
    return {
        "detail": {
            "type": type_,
            "code": code,
            "message": message,
            "request_id": secrets.token_hex(12),
        }
    }


class ElevenLabsRefusals(Refusals):
    """ElevenLabs' refusals: ``{"detail": {type, code, message, request_id}}``."""

    def unauthorized(self, missing: bool) -> Response:
        code = "missing_api_key" if missing else "invalid_api_key"
        message = "Missing xi-api-key header" if missing else "Invalid API key"
        return json_response(401, elevenlabs_error("authentication_error", code, message))

    def echo_key(self, message: str, delay_s: float) -> Response:
        body = elevenlabs_error("authentication_error", "invalid_api_key", message)
        return json_response(401, body, delay_s=delay_s)

    def throttled(self, sc: Scenario, delay_s: float) -> Response:
        body = elevenlabs_error(
            "rate_limit_error", "rate_limit_exceeded", "Too many requests, please slow down"
        )
        return json_response(429, body, {"Retry-After": str(sc.retry_after_s)}, delay_s=delay_s)

    def server_error(self, sc: Scenario, delay_s: float) -> Response:
        body = elevenlabs_error("internal_server_error", "internal_error", "Internal error")
        return json_response(sc.server_error_status or 500, body, delay_s=delay_s)

    def invalid(self, message: str) -> Response:
        return json_response(422, elevenlabs_error("validation_error", "invalid_request", message))

    def not_found(self, message: str) -> Response:
        return json_response(404, elevenlabs_error("not_found", "not_found", message))

    def rejected(self, status: int, message: str, delay_s: float) -> Response:
        body = elevenlabs_error("invalid_request", "request_rejected", message)
        return json_response(status, body, delay_s=delay_s)

    def timed_out(self) -> Response:
        return json_response(504, elevenlabs_error("timeout", "request_timeout", "Request timed out"))


def render_dubbing(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    sc = task.scenario
    status = {"succeeded": "dubbed", "failed": "failed"}.get(phase) or shapes.running_value(task.family, i)
    body: dict[str, Any] = {
        "dubbing_id": task.task_id,
        "name": task.meta.get("name", "sandbox dub"),
        "status": status,
        "source_language": task.meta.get("source_lang", "en"),
        "target_languages": list(task.target_languages),
        "editable": False,
        "created_at": iso_time(task.created_at),
        "media_metadata": {"content_type": "audio/mpeg", "duration": 12.5},
    }
    if phase == "failed":
        body["error"] = sc.error_message or "Dubbing failed"
    return body
