"""How each provider answers a request it refuses or cannot serve, in its own error shape.

One switch per refusal (unauthorized, throttled, server error, invalid, not found) over the four
providers, plus the request-body parsing that answers bad input in the same shapes.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import json
import zlib
from typing import Any
from urllib.parse import parse_qs, quote

from recon_dagster.sandbox import plugins, shapes
from recon_dagster.sandbox.scenario import Scenario, ScenarioError
from recon_dagster.sandbox.wire import BadRequest, Json, Request, Response, json_response

# -- provider error responses ----------------------------------------------------------------

KIE, REPLICATE, ELEVENLABS, ANTHROPIC = "kie", "replicate", "elevenlabs", "anthropic"


def unauthorized(provider: str, missing: bool) -> Response:
    error = plugins.refusal(provider)
    if error is not None:
        return error(401, "authentication_error", "No key" if missing else "Invalid key", {}, 0.0)
    if provider == KIE:
        return json_response(401, shapes.kie_error(401, "You do not have access permissions"))
    if provider == REPLICATE:
        return json_response(
            401,
            shapes.replicate_problem(401, "Unauthenticated", "You did not pass a valid authentication token"),
            content_type="application/problem+json",
        )
    if provider == ELEVENLABS:
        code = "missing_api_key" if missing else "invalid_api_key"
        message = "Missing xi-api-key header" if missing else "Invalid API key"
        return json_response(401, shapes.elevenlabs_error("authentication_error", code, message))
    message = "x-api-key header is required" if missing else "invalid x-api-key"  # the service's words
    return json_response(401, shapes.anthropic_error("authentication_error", message))


def echo_key(provider: str, req: Request, delay_s: float, escaped: bool = False) -> Response:
    """A gateway that rejects the key and echoes it back, as sent and URL-encoded (or escaped)."""
    header = (
        "xi-api-key" if provider == ELEVENLABS else "x-api-key" if provider == ANTHROPIC else "Authorization"
    )
    presented = req.headers.get(header) or ""
    token = presented.partition(" ")[2] if header == "Authorization" else presented
    if escaped:
        return escaped_echo(token, delay_s)
    message = f"Invalid API key {presented} (rejected {req.path}?api_key={quote(token, safe='')})"
    error = plugins.refusal(provider)
    if error is not None:
        return error(401, "authentication_error", message, {}, delay_s)
    if provider == KIE:
        return json_response(200, shapes.kie_error(401, message), delay_s=delay_s)
    if provider == REPLICATE:
        body = shapes.replicate_problem(401, "Unauthenticated", message)
        return json_response(401, body, content_type="application/problem+json", delay_s=delay_s)
    return json_response(
        401, shapes.elevenlabs_error("authentication_error", "invalid_api_key", message), delay_s=delay_s
    )


def escaped_echo(token: str, delay_s: float) -> Response:
    """HTTP 500 with a JSON body (built by hand: ``json.dumps`` escapes nothing of an ASCII key)
    spelling the key as encoders that escape freely do: every character as ``\\uXXXX`` (hex case
    alternating), then every other character, then only ``/`` as ``\\/``; plus a Basic credential."""

    def u(i: int, ch: str) -> str:
        return f"\\u{ord(ch):04x}" if i % 2 else f"\\u{ord(ch):04X}"

    every = "".join(u(i, ch) for i, ch in enumerate(token))
    alternate = "".join(u(i, ch) if i % 2 else ch.replace("/", "\\/") for i, ch in enumerate(token))
    slashed = token.replace("/", "\\/")
    basic = base64.b64encode(f"api:{token}".encode()).decode()
    body = (
        f'{{"error":{{"message":"upstream rejected key {every}","detail":"key {alternate} / {slashed}",'
        f'"request":{{"authorization":"Basic {basic}"}}}}}}'
    )
    return Response(500, body.encode(), delay_s=delay_s)


def gzip_bomb(decoded_bytes: int) -> bytes:
    """A gzip body that inflates to ``decoded_bytes`` (a JSON string of zeros, cut short)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [packer.compress(b'{"code": 200, "data": "')]
    block = b"0" * (1 << 20)
    left = decoded_bytes
    while left > 0:
        parts.append(packer.compress(block[: min(left, len(block))]))
        left -= len(block)
    parts.append(packer.flush())
    return b"".join(parts)


def throttled(provider: str, sc: Scenario, delay_s: float) -> Response:
    retry = str(sc.retry_after_s)
    headers = {"Retry-After": retry}
    error = plugins.refusal(provider)
    if error is not None:
        return error(429, "rate_limited", "Too many requests", headers, delay_s)
    if provider == KIE:
        status = 200 if sc.kie_http200_errors else 429
        body: Json = shapes.kie_error(429, "Rate limited: too many requests, please retry later")
        return json_response(status, body, headers, delay_s=delay_s)
    if provider == REPLICATE:
        headers.update({"ratelimit-remaining": "0", "ratelimit-reset": retry})
        body = {
            "detail": f"Request was throttled. Expected available in {retry} second.",
            "status": 429,
        }
        return json_response(429, body, headers, "application/problem+json", delay_s)
    if provider == ELEVENLABS:
        body = shapes.elevenlabs_error(
            "rate_limit_error", "rate_limit_exceeded", "Too many requests, please slow down"
        )
        return json_response(429, body, headers, delay_s=delay_s)
    body = shapes.anthropic_error("rate_limit_error", "Number of requests has exceeded your rate limit")
    return json_response(429, body, {"retry-after": retry}, delay_s=delay_s)


def server_error(provider: str, sc: Scenario, delay_s: float) -> Response:
    status = sc.server_error_status or (503 if provider == REPLICATE else 500)
    error = plugins.refusal(provider)
    if error is not None:
        return error(status, "internal_error", "Internal server error", {}, delay_s)
    if provider == KIE:
        http = 200 if sc.kie_http200_errors else status
        body: Json = shapes.kie_error(status, "Server error, please try again later")
        return json_response(http, body, delay_s=delay_s)
    if provider == REPLICATE:
        body = shapes.replicate_problem(status, "Service Unavailable", "Please retry shortly")
        return json_response(status, body, content_type="application/problem+json", delay_s=delay_s)
    if provider == ELEVENLABS:
        body = shapes.elevenlabs_error("internal_server_error", "internal_error", "Internal error")
        return json_response(status, body, delay_s=delay_s)
    anthropic_type = {529: "overloaded_error", 504: "timeout_error"}.get(status, "api_error")
    body = shapes.anthropic_error(anthropic_type, "Internal server error")
    return json_response(status, body, delay_s=delay_s)


def invalid(provider: str, message: str) -> Response:
    """A request our client got wrong, in the provider's validation-error shape."""
    error = plugins.refusal(provider)
    if error is not None:
        return error(422, "validation_error", message, {}, 0.0)
    if provider == KIE:
        return json_response(200, shapes.kie_error(422, message))
    if provider == REPLICATE:
        body = shapes.replicate_problem(422, "Input validation failed", message)
        return json_response(422, body, content_type="application/problem+json")
    if provider == ELEVENLABS:
        return json_response(422, shapes.elevenlabs_error("validation_error", "invalid_request", message))
    return json_response(400, shapes.anthropic_error("invalid_request_error", message))


def not_found(provider: str | None, message: str) -> Response:
    error = plugins.refusal(provider)
    if error is not None:
        return error(404, "not_found", message, {}, 0.0)
    if provider == KIE:
        return json_response(404, shapes.kie_error(404, message))
    if provider == REPLICATE:
        body = shapes.replicate_problem(404, "Not found", message)
        return json_response(404, body, content_type="application/problem+json")
    if provider == ELEVENLABS:
        return json_response(404, shapes.elevenlabs_error("not_found", "not_found", message))
    if provider == ANTHROPIC:
        return json_response(404, shapes.anthropic_error("not_found_error", message))
    return json_response(404, {"error": message})


_S3_ERRORS = {
    403: ("AccessDenied", "Request has expired"),
    404: ("NoSuchKey", "The specified key does not exist."),
    410: ("Gone", "The requested object is no longer available."),
}


def media_error(status: int) -> Response:
    code, message = _S3_ERRORS.get(status, ("InternalError", "We encountered an internal error."))
    body = f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>'
    return Response(status, body.encode(), "application/xml")


# -- request parsing -------------------------------------------------------------------------


def json_body(req: Request, provider: str) -> Json:
    if not req.body:
        raise BadRequest(invalid(provider, "request body must be a JSON object"))
    try:
        data = json.loads(req.body)
    except ValueError as exc:
        raise BadRequest(invalid(provider, f"request body is not valid JSON: {exc}")) from None
    if not isinstance(data, dict):
        raise BadRequest(invalid(provider, "request body must be a JSON object"))
    return data


def form_body(req: Request, provider: str) -> dict[str, str | bytes]:
    """Fields of a multipart/form-data, urlencoded or JSON body (files as bytes)."""
    ctype = req.headers.get("Content-Type", "")
    if ctype.startswith("multipart/form-data"):
        raw = b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + req.body
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(raw)
        out: dict[str, str | bytes] = {}
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if not name:
                continue
            payload = part.get_payload(decode=True)
            data = payload if isinstance(payload, bytes) else b""
            out[str(name)] = data if part.get_filename() else data.decode("utf-8", "replace")
        return out
    if ctype.startswith("application/x-www-form-urlencoded"):
        parsed = parse_qs(req.body.decode("utf-8", "replace"))
        return {k: v[0] for k, v in parsed.items()}
    return {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in json_body(req, provider).items()}


def requested_scenario(raw: Any, provider: str) -> Scenario | None:
    if raw is None:
        return None
    try:
        if isinstance(raw, str):
            raw = json.loads(raw)
        return Scenario.from_dict(raw)
    except (ValueError, ScenarioError) as exc:
        raise BadRequest(invalid(provider, f"sandbox_scenario: {exc}")) from None
