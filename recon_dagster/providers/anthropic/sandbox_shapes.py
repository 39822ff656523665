"""Anthropic's answers in the sandbox: its error body, its refusals and a Messages API reply."""

from __future__ import annotations

import secrets
from typing import Any

from recon_dagster.sandbox.refusals import Refusals
from recon_dagster.sandbox.scenario import Scenario
from recon_dagster.sandbox.wire import Response, json_response


def anthropic_error(type_: str, message: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": type_, "message": message},
        "request_id": "req_" + secrets.token_hex(12),
    }


class AnthropicRefusals(Refusals):
    """Anthropic's refusals: ``{"type": "error", "error": {type, message}, "request_id"}``."""

    def unauthorized(self, missing: bool) -> Response:
        message = "x-api-key header is required" if missing else "invalid x-api-key"  # the service's words
        return json_response(401, anthropic_error("authentication_error", message))

    def throttled(self, sc: Scenario, delay_s: float) -> Response:
        body = anthropic_error("rate_limit_error", "Number of requests has exceeded your rate limit")
        return json_response(429, body, {"retry-after": str(sc.retry_after_s)}, delay_s=delay_s)

    def server_error(self, sc: Scenario, delay_s: float) -> Response:
        status = sc.server_error_status or 500
        error_type = {529: "overloaded_error", 504: "timeout_error"}.get(status, "api_error")
        return json_response(status, anthropic_error(error_type, "Internal server error"), delay_s=delay_s)

    def invalid(self, message: str) -> Response:
        return json_response(400, anthropic_error("invalid_request_error", message))

    def not_found(self, message: str) -> Response:
        return json_response(404, anthropic_error("not_found_error", message))

    def timed_out(self) -> Response:
        return json_response(504, anthropic_error("timeout_error", "Request timed out"))

    # The Messages API is sync: no task to poll (no key-echoing poll answer), no create gate.
    def echo_key(self, message: str, delay_s: float) -> Response:
        return json_response(401, anthropic_error("authentication_error", message), delay_s=delay_s)

    def rejected(self, status: int, message: str, delay_s: float) -> Response:
        return json_response(status, anthropic_error("invalid_request_error", message), delay_s=delay_s)


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
