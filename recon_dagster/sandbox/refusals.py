"""How each provider answers a request it refuses or cannot serve, in its own error shape.

Each refusal (unauthorized, throttled, server error, invalid, not found, rejected, timed out) is
asked of the provider's ``Refusals`` (its plugin's, or one built from its plugin's single error
shape), plus the request-body parsing that answers bad input in the same shapes.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import json
import zlib
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, quote

from recon_dagster.sandbox import plugins
from recon_dagster.sandbox.scenario import Scenario, ScenarioError
from recon_dagster.sandbox.wire import BadRequest, Json, Request, Response, json_response

# -- provider error responses ----------------------------------------------------------------

# (status, error type, message, extra headers, delay) -> a refusal in the provider's error shape.
ErrorShape = Callable[[int, str, str, Mapping[str, str], float], Response]


class Refusals:
    """How a provider refuses a request. The base class builds every refusal from the provider's
    one ``error`` shape; a provider whose refusals each have their own documented body (status,
    headers, wording) overrides them."""

    def __init__(self, error: ErrorShape | None = None) -> None:
        self._error = error

    def error(
        self, status: int, error_type: str, message: str, headers: Mapping[str, str], delay_s: float
    ) -> Response:
        if self._error is None:
            raise NotImplementedError("a provider plugin needs `error` or `refusals`")
        return self._error(status, error_type, message, headers, delay_s)

    def unauthorized(self, missing: bool) -> Response:
        return self.error(401, "authentication_error", "No key" if missing else "Invalid key", {}, 0.0)

    def echo_key(self, message: str, delay_s: float) -> Response:
        """A gateway's rejection that echoes the key in ``message``."""
        return self.error(401, "authentication_error", message, {}, delay_s)

    def throttled(self, sc: Scenario, delay_s: float) -> Response:
        return self.error(
            429, "rate_limited", "Too many requests", {"Retry-After": str(sc.retry_after_s)}, delay_s
        )

    def server_error(self, sc: Scenario, delay_s: float) -> Response:
        status = sc.server_error_status or 500
        return self.error(status, "internal_error", "Internal server error", {}, delay_s)

    def invalid(self, message: str) -> Response:
        return self.error(422, "validation_error", message, {}, 0.0)

    def not_found(self, message: str) -> Response:
        return self.error(404, "not_found", message, {}, 0.0)

    def rejected(self, status: int, message: str, delay_s: float) -> Response:
        """A create the provider refuses (``create_reject_status``, e.g. 402 out of credits)."""
        return self.error(status, "request_rejected", message, {}, delay_s)

    def timed_out(self) -> Response:
        """A sync call held open until the gateway gave up (504)."""
        return self.error(504, "timeout", "Request timed out", {}, 0.0)


def refusals_of(provider: str) -> Refusals:
    """How ``provider`` refuses a request, in its own shapes."""
    plugin = plugins.plugins()[provider]
    return plugin.refusals or Refusals(plugin.error)


def unauthorized(provider: str, missing: bool) -> Response:
    return refusals_of(provider).unauthorized(missing)


def echo_key(provider: str, req: Request, delay_s: float, escaped: bool = False) -> Response:
    """A gateway that rejects the key and echoes it back, as sent and URL-encoded (or escaped)."""
    header = plugins.plugins()[provider].key_header
    presented = req.headers.get(header) or ""
    token = presented.partition(" ")[2] if header == "Authorization" else presented
    if escaped:
        return escaped_echo(token, delay_s)
    message = f"Invalid API key {presented} (rejected {req.path}?api_key={quote(token, safe='')})"
    return refusals_of(provider).echo_key(message, delay_s)


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
    return refusals_of(provider).throttled(sc, delay_s)


def server_error(provider: str, sc: Scenario, delay_s: float) -> Response:
    return refusals_of(provider).server_error(sc, delay_s)


def invalid(provider: str, message: str) -> Response:
    """A request our client got wrong, in the provider's validation-error shape."""
    return refusals_of(provider).invalid(message)


def not_found(provider: str | None, message: str) -> Response:
    if provider is None or provider not in plugins.plugins():
        return json_response(404, {"error": message})
    return refusals_of(provider).not_found(message)


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
