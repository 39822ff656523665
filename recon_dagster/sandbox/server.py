"""The provider sandbox: one loopback HTTP server speaking KIE, Replicate, ElevenLabs and Anthropic.

Routes live under path prefixes (``/kie``, ``/replicate/v1``, ``/elevenlabs``, ``/anthropic``),
media under ``/media`` and a key-less JSON admin API under ``/_sandbox``. Handlers decide what
to answer from ``SandboxState`` (holding its lock only for counters), then sleep the simulated
latency and write the response outside any lock, so many calls proceed concurrently.
"""

from __future__ import annotations

import base64
import contextlib
import email.parser
import email.policy
import hmac
import json
import re
import secrets
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from recon_dagster.core.kinds import Family, get_kind
from recon_dagster.sandbox import shapes
from recon_dagster.sandbox.media import MEDIA_TYPES, iter_media, media_length
from recon_dagster.sandbox.scenario import Scenario, ScenarioError, media_kind_for, poll_phase
from recon_dagster.sandbox.state import SandboxState, Task, max_in_window

MAX_BODY = 64 * 1024 * 1024
# How long a sync call of a run_forever scenario is held open before a gateway timeout.
SYNC_HANG_S = 3600.0

Json = dict[str, Any]


@dataclass
class Response:
    """What to send back; ``body`` may be an iterable of chunks (streamed, never joined)."""

    status: int
    body: bytes | Iterable[bytes] = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    length: int | None = None
    # Close the connection without answering (a create whose answer is lost on the way back).
    drop: bool = False
    delay_s: float = 0.0


def _json(
    status: int,
    body: Any,
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
    delay_s: float = 0.0,
) -> Response:
    data = json.dumps(body, separators=(",", ":")).encode()
    return Response(status, data, content_type, dict(headers or {}), delay_s=delay_s)


class BadRequest(Exception):
    """A request the sandbox refuses; carries the provider-shaped response to send."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Any  # email.message.Message from http.server
    body: bytes

    def q(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


# -- provider error responses ----------------------------------------------------------------

KIE, REPLICATE, ELEVENLABS, ANTHROPIC = "kie", "replicate", "elevenlabs", "anthropic"


def _unauthorized(provider: str, missing: bool) -> Response:
    if provider == KIE:
        return _json(401, shapes.kie_error(401, "You do not have access permissions"))
    if provider == REPLICATE:
        return _json(
            401,
            shapes.replicate_problem(401, "Unauthenticated", "You did not pass a valid authentication token"),
            content_type="application/problem+json",
        )
    if provider == ELEVENLABS:
        code = "missing_api_key" if missing else "invalid_api_key"
        message = "Missing xi-api-key header" if missing else "Invalid API key"
        return _json(401, shapes.elevenlabs_error("authentication_error", code, message))
    message = "x-api-key header is required" if missing else "invalid x-api-key"  # the service's words
    return _json(401, shapes.anthropic_error("authentication_error", message))


def _bearer(header: str | None, also: tuple[str, ...] = ()) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (or one of the ``also`` schemes)."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme == "Bearer" or scheme in also else None


def _echo_key(provider: str, req: Request, delay_s: float, escaped: bool = False) -> Response:
    """A gateway that rejects the key and echoes it back, as sent and URL-encoded (or escaped)."""
    header = (
        "xi-api-key" if provider == ELEVENLABS else "x-api-key" if provider == ANTHROPIC else "Authorization"
    )
    presented = req.headers.get(header) or ""
    token = presented.partition(" ")[2] if header == "Authorization" else presented
    if escaped:
        return _escaped_echo(token, delay_s)
    message = f"Invalid API key {presented} (rejected {req.path}?api_key={quote(token, safe='')})"
    if provider == KIE:
        return _json(200, shapes.kie_error(401, message), delay_s=delay_s)
    if provider == REPLICATE:
        body = shapes.replicate_problem(401, "Unauthenticated", message)
        return _json(401, body, content_type="application/problem+json", delay_s=delay_s)
    return _json(
        401, shapes.elevenlabs_error("authentication_error", "invalid_api_key", message), delay_s=delay_s
    )


def _escaped_echo(token: str, delay_s: float) -> Response:
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


def _gzip_bomb(decoded_bytes: int) -> bytes:
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


def _throttled(provider: str, sc: Scenario, delay_s: float) -> Response:
    retry = str(sc.retry_after_s)
    headers = {"Retry-After": retry}
    if provider == KIE:
        status = 200 if sc.kie_http200_errors else 429
        body: Json = shapes.kie_error(429, "Rate limited: too many requests, please retry later")
        return _json(status, body, headers, delay_s=delay_s)
    if provider == REPLICATE:
        headers.update({"ratelimit-remaining": "0", "ratelimit-reset": retry})
        body = {
            "detail": f"Request was throttled. Expected available in {retry} second.",
            "status": 429,
        }
        return _json(429, body, headers, "application/problem+json", delay_s)
    if provider == ELEVENLABS:
        body = shapes.elevenlabs_error(
            "rate_limit_error", "rate_limit_exceeded", "Too many requests, please slow down"
        )
        return _json(429, body, headers, delay_s=delay_s)
    body = shapes.anthropic_error("rate_limit_error", "Number of requests has exceeded your rate limit")
    return _json(429, body, {"retry-after": retry}, delay_s=delay_s)


def _server_error(provider: str, sc: Scenario, delay_s: float) -> Response:
    status = sc.server_error_status or (503 if provider == REPLICATE else 500)
    if provider == KIE:
        http = 200 if sc.kie_http200_errors else status
        body: Json = shapes.kie_error(status, "Server error, please try again later")
        return _json(http, body, delay_s=delay_s)
    if provider == REPLICATE:
        body = shapes.replicate_problem(status, "Service Unavailable", "Please retry shortly")
        return _json(status, body, content_type="application/problem+json", delay_s=delay_s)
    if provider == ELEVENLABS:
        body = shapes.elevenlabs_error("internal_server_error", "internal_error", "Internal error")
        return _json(status, body, delay_s=delay_s)
    anthropic_type = {529: "overloaded_error", 504: "timeout_error"}.get(status, "api_error")
    body = shapes.anthropic_error(anthropic_type, "Internal server error")
    return _json(status, body, delay_s=delay_s)


def _invalid(provider: str, message: str) -> Response:
    """A request our client got wrong, in the provider's validation-error shape."""
    if provider == KIE:
        return _json(200, shapes.kie_error(422, message))
    if provider == REPLICATE:
        body = shapes.replicate_problem(422, "Input validation failed", message)
        return _json(422, body, content_type="application/problem+json")
    if provider == ELEVENLABS:
        return _json(422, shapes.elevenlabs_error("validation_error", "invalid_request", message))
    return _json(400, shapes.anthropic_error("invalid_request_error", message))


def _not_found(provider: str | None, message: str) -> Response:
    if provider == KIE:
        return _json(404, shapes.kie_error(404, message))
    if provider == REPLICATE:
        body = shapes.replicate_problem(404, "Not found", message)
        return _json(404, body, content_type="application/problem+json")
    if provider == ELEVENLABS:
        return _json(404, shapes.elevenlabs_error("not_found", "not_found", message))
    if provider == ANTHROPIC:
        return _json(404, shapes.anthropic_error("not_found_error", message))
    return _json(404, {"error": message})


_S3_ERRORS = {
    403: ("AccessDenied", "Request has expired"),
    404: ("NoSuchKey", "The specified key does not exist."),
    410: ("Gone", "The requested object is no longer available."),
}


def _media_error(status: int) -> Response:
    code, message = _S3_ERRORS.get(status, ("InternalError", "We encountered an internal error."))
    body = f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>'
    return Response(status, body.encode(), "application/xml")


# -- request parsing -------------------------------------------------------------------------


def _json_body(req: Request, provider: str) -> Json:
    if not req.body:
        raise BadRequest(_invalid(provider, "request body must be a JSON object"))
    try:
        data = json.loads(req.body)
    except ValueError as exc:
        raise BadRequest(_invalid(provider, f"request body is not valid JSON: {exc}")) from None
    if not isinstance(data, dict):
        raise BadRequest(_invalid(provider, "request body must be a JSON object"))
    return data


def _form_body(req: Request, provider: str) -> dict[str, str | bytes]:
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
    return {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in _json_body(req, provider).items()}


def _requested_scenario(raw: Any, provider: str) -> Scenario | None:
    if raw is None:
        return None
    try:
        if isinstance(raw, str):
            raw = json.loads(raw)
        return Scenario.from_dict(raw)
    except (ValueError, ScenarioError) as exc:
        raise BadRequest(_invalid(provider, f"sandbox_scenario: {exc}")) from None


# Market models route to the kind whose thresholds fit them; a body may say ``sandbox_kind``.
_MARKET_KINDS = ("kie-standard", "kie-kling3", "kie-lip-sync")


def _market_kind(model: str, override: Any) -> str:
    if override is not None:
        if override not in _MARKET_KINDS:
            raise BadRequest(_invalid(KIE, f"sandbox_kind must be one of {', '.join(_MARKET_KINDS)}"))
        return str(override)
    lowered = model.lower()
    if "kling" in lowered:
        return "kie-kling3"
    if any(word in lowered for word in ("lip", "infinitalk", "avatar", "talking")):
        return "kie-lip-sync"
    return "kie-standard"


# KIE create path -> (family, required fields)
_KIE_CREATE: dict[str, tuple[Family, tuple[str, ...]]] = {
    "/kie/api/v1/jobs/createTask": (Family.KIE_MARKET, ("model",)),
    "/kie/api/v1/veo/generate": (Family.KIE_VEO, ("prompt",)),
    "/kie/api/v1/generate": (Family.KIE_SUNO, ()),
    "/kie/api/v1/flux/kontext/generate": (Family.KIE_KONTEXT, ("prompt",)),
    "/kie/api/v1/runway/generate": (Family.KIE_RUNWAY, ("prompt",)),
    "/kie/api/v1/modify/generate": (Family.KIE_LUMA, ("prompt", "videoUrl")),
}
_KIE_POLL: dict[str, Family] = {
    "/kie/api/v1/jobs/recordInfo": Family.KIE_MARKET,
    "/kie/api/v1/veo/record-info": Family.KIE_VEO,
    "/kie/api/v1/generate/record-info": Family.KIE_SUNO,
    "/kie/api/v1/flux/kontext/record-info": Family.KIE_KONTEXT,
    "/kie/api/v1/runway/record-detail": Family.KIE_RUNWAY,
    "/kie/api/v1/modify/record-info": Family.KIE_LUMA,
}
_FAMILY_KIND: dict[Family, str] = {
    Family.KIE_VEO: "kie-veo",
    Family.KIE_SUNO: "kie-suno",
    Family.KIE_KONTEXT: "kie-kontext",
    Family.KIE_RUNWAY: "kie-runway",
    Family.KIE_LUMA: "kie-luma",
    Family.REPLICATE_PREDICTION: "replicate-prediction",
    Family.REPLICATE_TRAINING: "replicate-training",
    Family.ELEVENLABS_DUBBING: "elevenlabs-async",
}

# Model names may hold a slash ("anthropic/claude-sonnet-4"); KIE puts the model in the path.
_RE_KIE_CHAT = re.compile(r"^/kie/(?:(?P<model>.+?)/)?v1/chat/completions$")
_RE_REP_MODEL_PRED = re.compile(r"^/replicate/v1/models/(?P<owner>[^/]+)/(?P<name>[^/]+)/predictions$")
_RE_REP_TRAIN_CREATE = re.compile(
    r"^/replicate/v1/models/(?P<owner>[^/]+)/(?P<name>[^/]+)/versions/(?P<version>[^/]+)/trainings$"
)
_RE_REP_GET = re.compile(r"^/replicate/v1/(?P<coll>predictions|trainings)/(?P<id>[^/]+)$")
_RE_REP_CANCEL = re.compile(r"^/replicate/v1/(?P<coll>predictions|trainings)/(?P<id>[^/]+)/cancel$")
_RE_DUB_GET = re.compile(r"^/elevenlabs/v1/dubbing/(?P<id>[^/]+)$")
_RE_DUB_AUDIO = re.compile(r"^/elevenlabs/v1/dubbing/(?P<id>[^/]+)/audio/(?P<lang>[^/]+)$")
_RE_TTS = re.compile(r"^/elevenlabs/v1/text-to-speech/(?P<voice>[^/]+)(?:/stream)?$")
_RE_MEDIA = re.compile(r"^/media/(?P<id>[^/]+)/(?:(?P<cover>cover-)?(?P<n>\d+))\.(?P<ext>[a-z0-9]+)$")
_RE_ADMIN_TASK = re.compile(r"^/_sandbox/tasks/(?P<id>[^/]+)$")


# Handlers that start billed work (a task, a sync call); every other API request is a read.
_CREATE_ROUTES = frozenset(
    {
        "_kie_create",
        "_kie_chat",
        "_replicate_predict",
        "_replicate_train",
        "_dub_create",
        "_tts",
        "_anthropic",
    }
)


class Sandbox:
    """The request-answering logic, independent of the socket plumbing in ``SandboxServer``."""

    def __init__(self, api_key: str, latency_s: float) -> None:
        self.api_key = api_key
        self.latency_s = latency_s
        self.state = SandboxState()
        self.base_url = ""
        # Set on stop and on reset, so calls held open by run_forever scenarios end promptly.
        self.release = threading.Event()

    # -- helpers ------------------------------------------------------------------------------

    def _latency(self, sc: Scenario | None) -> float:
        if sc is not None and sc.latency_s is not None:
            return sc.latency_s
        return self.latency_s

    def _check_auth(self, provider: str, req: Request) -> None:
        if provider in (KIE, REPLICATE):
            # Replicate still accepts its older "Token" scheme.
            presented = _bearer(
                req.headers.get("Authorization"), also=("Token",) if provider == REPLICATE else ()
            )
        elif provider == ELEVENLABS:
            presented = req.headers.get("xi-api-key")
        else:
            # Anthropic takes x-api-key (our client, older SDKs) or a Bearer token (its SDK since
            # the 2026-10-21 API version); x-api-key wins when both are sent.
            presented = req.headers.get("x-api-key") or _bearer(req.headers.get("Authorization"))
        if not presented or not hmac.compare_digest(presented.encode(), self.api_key.encode()):
            raise BadRequest(_unauthorized(provider, missing=not presented))

    def links(self, task: Task) -> shapes.Links:
        kind = media_kind_for(task.family, task.scenario)
        ext = MEDIA_TYPES[kind][0]
        count = (
            1
            if task.family in (Family.KIE_KONTEXT, Family.KIE_RUNWAY, Family.REPLICATE_TRAINING)
            else task.scenario.media_count
        )
        return shapes.Links(
            media=tuple(f"{self.base_url}/media/{task.task_id}/{i}.{ext}" for i in range(count)),
            covers=tuple(f"{self.base_url}/media/{task.task_id}/cover-{i}.png" for i in range(count)),
            replicate_base=f"{self.base_url}/replicate/v1",
        )

    def media_urls(self, task: Task) -> list[str]:
        """Where a client fetches this task's media (ElevenLabs: the audio endpoint)."""
        if task.family is Family.ELEVENLABS_DUBBING:
            return [
                f"{self.base_url}/elevenlabs/v1/dubbing/{task.task_id}/audio/{lang}"
                for lang in task.target_languages
            ]
        return list(self.links(task).media)

    def _answer_poll(
        self, task: Task, answered_index: int, provider: str, req: Request | None = None
    ) -> Response:
        sc = task.scenario
        if sc.echo_key and req is not None:
            return _echo_key(provider, req, self._latency(sc), sc.echo_key_escaped)
        if sc.poll_gzip_bytes:
            return Response(
                200,
                _gzip_bomb(sc.poll_gzip_bytes),
                headers={"Content-Encoding": "gzip"},
                delay_s=self._latency(sc),
            )
        phase = poll_phase(answered_index, sc)
        running_index = answered_index if phase == "running" else 0
        self.state.mark_times(task, phase, time.time())
        body = shapes.poll_body(task, phase, running_index, self.links(task))
        delay = self._latency(sc)
        if sc.malformed:
            raw = shapes.malformed_body(task.family, body, sc.malformed_kind)
            ctype = "text/html" if sc.malformed_kind == "not_json" else "application/json"
            return Response(200, raw, ctype, delay_s=delay)
        if sc.gzip_polls:
            packed = zlib.compress(json.dumps(body).encode(), 6, 31)
            return Response(200, packed, headers={"Content-Encoding": "gzip"}, delay_s=delay)
        if sc.poll_drip_s:
            data = json.dumps(body).encode()
            return Response(200, self._drip([data], sc.poll_drip_s), length=len(data), delay_s=delay)
        return _json(200, body, delay_s=delay)

    def _drip(self, chunks: Iterable[bytes], every_s: float) -> Iterator[bytes]:
        """One byte every ``every_s``; the rest at once when the sandbox is reset or stopped."""
        release = self.release
        for chunk in chunks:
            for i in range(len(chunk)):
                if release.is_set():
                    yield chunk[i:]
                    break
                yield chunk[i : i + 1]
                release.wait(every_s)

    def _ticket_response(self, ticket: Any, provider: str) -> Response | None:
        """A 429/5xx when the scenario injects one for this request, else None."""
        sc = ticket.task.scenario
        if ticket.injection == "rate_limited":
            return _throttled(provider, sc, self._latency(sc))
        if ticket.injection == "server_error":
            return _server_error(provider, sc, self._latency(sc))
        return None

    def _create_gate(self, provider: str, kind: str, sc: Scenario) -> tuple[str, Response | None]:
        action = self.state.create_decision(kind, sc)
        delay = self._latency(sc)
        if action == "rate_limited":
            return action, _throttled(provider, sc, delay)
        if action == "server_error":
            return action, _server_error(provider, sc, delay)
        if action == "rejected":
            status = sc.create_reject_status or 400
            message = sc.error_message or "Request rejected by the provider"
            if provider == KIE:
                return action, _json(200, shapes.kie_error(status, message), delay_s=delay)
            if provider == REPLICATE:
                body = shapes.replicate_problem(status, "Request rejected", message)
                return action, _json(status, body, content_type="application/problem+json", delay_s=delay)
            body = shapes.elevenlabs_error("invalid_request", "request_rejected", message)
            return action, _json(status, body, delay_s=delay)
        return action, None

    def _scenario_for(self, kind: str, requested: Scenario | None, provider: str) -> Scenario:
        sc = self.state.scenario_for(kind, requested)
        try:
            sc.check_for_kind(kind)
        except ScenarioError as exc:
            raise BadRequest(_invalid(provider, f"sandbox_scenario: {exc}")) from None
        return sc

    # -- dispatch -----------------------------------------------------------------------------

    def handle(self, req: Request) -> Response:
        """Answer one request."""
        path = req.path
        if path.startswith("/_sandbox/"):
            try:
                return self._admin(req)
            except BadRequest as exc:
                return exc.response
        self.state.count_request()
        if path.startswith("/media/"):
            return self._media(req)
        provider = next(
            (p for p in (KIE, REPLICATE, ELEVENLABS, ANTHROPIC) if path.startswith(f"/{p}/")), None
        )
        if provider is None:
            return _not_found(None, f"no sandbox endpoint {req.method} {path}")
        try:
            route = self._route(req, provider)
            # Every request that reaches a provider counts against its account, answered or not.
            create = route is not None and route.__name__ in _CREATE_ROUTES
            self.state.log_request(provider, "create" if create else "read")
            self._check_auth(provider, req)
            if route is None:
                return _not_found(provider, f"no such endpoint: {req.method} {path}")
            return route(req)
        except BadRequest as exc:
            return exc.response

    def _route(self, req: Request, provider: str) -> Callable[[Request], Response] | None:
        path, method = req.path, req.method
        if provider == KIE:
            if method == "POST" and path in _KIE_CREATE:
                return self._kie_create
            if method == "GET" and path in _KIE_POLL:
                return self._kie_poll
            if method == "POST" and _RE_KIE_CHAT.match(path):
                return self._kie_chat
        elif provider == REPLICATE:
            if method == "POST" and (path == "/replicate/v1/predictions" or _RE_REP_MODEL_PRED.match(path)):
                return self._replicate_predict
            if method == "POST" and _RE_REP_TRAIN_CREATE.match(path):
                return self._replicate_train
            if method == "GET" and _RE_REP_GET.match(path):
                return self._replicate_get
            if method == "POST" and _RE_REP_CANCEL.match(path):
                return self._replicate_cancel
        elif provider == ELEVENLABS:
            if method == "POST" and path == "/elevenlabs/v1/dubbing":
                return self._dub_create
            if method == "GET" and _RE_DUB_AUDIO.match(path):
                return self._dub_audio
            if method == "GET" and _RE_DUB_GET.match(path):
                return self._dub_get
            if method == "POST" and _RE_TTS.match(path):
                return self._tts
        elif method == "POST" and path == "/anthropic/v1/messages":
            return self._anthropic
        return None

    # -- KIE ----------------------------------------------------------------------------------

    def _kie_create(self, req: Request) -> Response:
        family, required = _KIE_CREATE[req.path]
        body = _json_body(req, KIE)
        missing = [name for name in required if not body.get(name)]
        if missing:
            return _invalid(KIE, f"{', '.join(missing)} is required")
        if family is Family.KIE_MARKET:
            if not isinstance(body.get("input", {}), dict):
                return _invalid(KIE, "input must be an object")
            kind = _market_kind(str(body["model"]), body.get("sandbox_kind"))
        else:
            kind = _FAMILY_KIND[family]
        sc = self._scenario_for(kind, _requested_scenario(body.get("sandbox_scenario"), KIE), KIE)
        action, refusal = self._create_gate(KIE, kind, sc)
        if refusal is not None:
            return refusal
        params = {k: v for k, v in body.items() if k not in ("sandbox_scenario", "sandbox_kind")}
        model = params.get("model")
        task_input = params.get("input") if family is Family.KIE_MARKET else params
        task = self.state.add_task(kind, sc, via_create=True, model=model, input=task_input)
        self.state.record_create(kind, task.task_id, req.body)
        if action == "lost":
            return Response(0, drop=True, delay_s=self._latency(sc))
        data = shapes.kie_envelope({"taskId": task.task_id})
        return _json(200, data, delay_s=self._latency(sc))

    def _kie_poll(self, req: Request) -> Response:
        family = _KIE_POLL[req.path]
        task_id = req.q("taskId")
        if not task_id:
            return _invalid(KIE, "taskId is required")
        ticket = self.state.poll(task_id, (family,))
        if ticket is None:
            return _json(200, shapes.kie_error(422, "recordInfo is null"), delay_s=self.latency_s)
        refusal = self._ticket_response(ticket, KIE)
        if refusal is not None:
            return refusal
        return self._answer_poll(ticket.task, ticket.answered_index, KIE, req)

    def _kie_chat(self, req: Request) -> Response:
        match = _RE_KIE_CHAT.match(req.path)
        assert match is not None
        body = _json_body(req, KIE)
        model = match.group("model") or body.get("model")
        if not model:
            return _invalid(KIE, "model is required")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return _invalid(KIE, "messages must be a non-empty array")
        sc = self._scenario_for("kie-llm", _requested_scenario(body.get("sandbox_scenario"), KIE), KIE)
        refusal = self._sync_gate(KIE, "kie-llm", sc, req)
        if refusal is not None:
            return refusal
        if sc.outcome == "fail":
            message = sc.error_message or "The model failed to produce a completion"
            return _json(200, shapes.kie_error(500, message), delay_s=self._latency(sc))
        text = "Sandbox completion."
        return _json(
            200, shapes.chat_completion(str(model), text, len(req.body) // 4), delay_s=self._latency(sc)
        )

    def _sync_gate(self, provider: str, kind: str, sc: Scenario, req: Request) -> Response | None:
        """Injected 429/5xx for a sync call, or a call held open (run_forever); counts the call."""
        decision = self.state.sync_decision(kind, sc)
        delay = self._latency(sc)
        if decision == "rate_limited":
            return _throttled(provider, sc, delay)
        if decision == "server_error":
            return _server_error(provider, sc, delay)
        self.state.record_create(kind, None, req.body)
        if sc.outcome == "run_forever":
            self.release.wait(SYNC_HANG_S)
            status = 504
            if provider == ANTHROPIC:
                return _json(status, shapes.anthropic_error("timeout_error", "Request timed out"))
            if provider == ELEVENLABS:
                body = shapes.elevenlabs_error("timeout", "request_timeout", "Request timed out")
                return _json(status, body)
            return _json(status, shapes.kie_error(504, "Request timed out"))
        return None

    # -- Replicate ----------------------------------------------------------------------------

    def _replicate_created(self, task: Task, action: str) -> Response:
        delay = self._latency(task.scenario)
        if action == "lost":
            return Response(0, drop=True, delay_s=delay)
        body = shapes.poll_body(task, "running", 0, self.links(task))
        return _json(201, body, delay_s=delay)

    def _replicate_predict(self, req: Request) -> Response:
        body = _json_body(req, REPLICATE)
        match = _RE_REP_MODEL_PRED.match(req.path)
        version = body.get("version")
        if match is None and not version:
            return _invalid(REPLICATE, "version is required")
        if not isinstance(body.get("input"), dict):
            return _invalid(REPLICATE, "input is required and must be an object")
        kind = "replicate-prediction"
        sc = self._scenario_for(kind, _requested_scenario(body.get("sandbox_scenario"), REPLICATE), REPLICATE)
        action, refusal = self._create_gate(REPLICATE, kind, sc)
        if refusal is not None:
            return refusal
        model = f"{match['owner']}/{match['name']}" if match else None
        meta = {"version": str(version)} if version else {}
        task = self.state.add_task(kind, sc, via_create=True, model=model, input=body["input"], meta=meta)
        self.state.record_create(kind, task.task_id, req.body)
        return self._replicate_created(task, action)

    def _replicate_train(self, req: Request) -> Response:
        match = _RE_REP_TRAIN_CREATE.match(req.path)
        assert match is not None
        body = _json_body(req, REPLICATE)
        if not body.get("destination"):
            return _invalid(REPLICATE, "destination is required")
        if not isinstance(body.get("input"), dict):
            return _invalid(REPLICATE, "input is required and must be an object")
        kind = "replicate-training"
        sc = self._scenario_for(kind, _requested_scenario(body.get("sandbox_scenario"), REPLICATE), REPLICATE)
        action, refusal = self._create_gate(REPLICATE, kind, sc)
        if refusal is not None:
            return refusal
        task = self.state.add_task(
            kind,
            sc,
            via_create=True,
            model=f"{match['owner']}/{match['name']}",
            input=body["input"],
            meta={"version": match["version"], "destination": body["destination"]},
        )
        self.state.record_create(kind, task.task_id, req.body)
        return self._replicate_created(task, action)

    @staticmethod
    def _replicate_family(coll: str) -> Family:
        return Family.REPLICATE_TRAINING if coll == "trainings" else Family.REPLICATE_PREDICTION

    def _replicate_get(self, req: Request) -> Response:
        match = _RE_REP_GET.match(req.path)
        assert match is not None
        ticket = self.state.poll(match["id"], (self._replicate_family(match["coll"]),))
        if ticket is None:
            return _not_found(REPLICATE, "The requested resource could not be found.")
        refusal = self._ticket_response(ticket, REPLICATE)
        if refusal is not None:
            return refusal
        return self._answer_poll(ticket.task, ticket.answered_index, REPLICATE, req)

    def _replicate_cancel(self, req: Request) -> Response:
        match = _RE_REP_CANCEL.match(req.path)
        assert match is not None
        ticket = self.state.task_request(match["id"], (self._replicate_family(match["coll"]),))
        if ticket is None:
            return _not_found(REPLICATE, "The requested resource could not be found.")
        refusal = self._ticket_response(ticket, REPLICATE)
        if refusal is not None:
            return refusal
        task = ticket.task
        # Only a task that is still running upstream can be canceled.
        if poll_phase(task.answered, task.scenario) == "running":
            self.state.cancel(task)
        phase = poll_phase(task.answered, task.scenario)
        body = shapes.poll_body(task, phase, task.answered, self.links(task))
        return _json(200, body, delay_s=self._latency(task.scenario))

    # -- ElevenLabs ---------------------------------------------------------------------------

    def _dub_create(self, req: Request) -> Response:
        form = _form_body(req, ELEVENLABS)
        target = form.get("target_lang")
        if not isinstance(target, str) or not target:
            return _invalid(ELEVENLABS, "target_lang is required")
        if not form.get("file") and not form.get("source_url"):
            return _invalid(ELEVENLABS, "either file or source_url is required")
        kind = "elevenlabs-async"
        sc = self._scenario_for(
            kind, _requested_scenario(form.get("sandbox_scenario"), ELEVENLABS), ELEVENLABS
        )
        action, refusal = self._create_gate(ELEVENLABS, kind, sc)
        if refusal is not None:
            return refusal
        meta = {k: form[k] for k in ("name", "source_lang") if isinstance(form.get(k), str)}
        task = self.state.add_task(
            kind,
            sc,
            via_create=True,
            target_languages=(target,),
            meta=meta,
            input={k: v for k, v in form.items() if isinstance(v, str) and k != "sandbox_scenario"},
        )
        self.state.record_create(kind, task.task_id, req.body)
        if action == "lost":
            return Response(0, drop=True, delay_s=self._latency(sc))
        body = {"dubbing_id": task.task_id, "expected_duration_sec": 12.5}
        return _json(200, body, delay_s=self._latency(sc))

    def _dub_get(self, req: Request) -> Response:
        match = _RE_DUB_GET.match(req.path)
        assert match is not None
        ticket = self.state.poll(match["id"], (Family.ELEVENLABS_DUBBING,))
        if ticket is None:
            message = f"Dubbing {match['id']} not found"
            body = shapes.elevenlabs_error("not_found", "dubbing_not_found", message)
            return _json(404, body, delay_s=self.latency_s)
        refusal = self._ticket_response(ticket, ELEVENLABS)
        if refusal is not None:
            return refusal
        return self._answer_poll(ticket.task, ticket.answered_index, ELEVENLABS, req)

    def _dub_audio(self, req: Request) -> Response:
        match = _RE_DUB_AUDIO.match(req.path)
        assert match is not None
        ticket = self.state.task_request(match["id"], (Family.ELEVENLABS_DUBBING,))
        if ticket is None:
            body = shapes.elevenlabs_error(
                "not_found", "dubbing_not_found", f"Dubbing {match['id']} not found"
            )
            return _json(404, body)
        task = ticket.task
        self.state.count_media(task.task_id)
        refusal = self._ticket_response(ticket, ELEVENLABS)
        if refusal is not None:
            return refusal
        sc = task.scenario
        if match["lang"] not in task.target_languages:
            body = shapes.elevenlabs_error(
                "not_found",
                "language_not_found",
                f"Language {match['lang']} is not a target language of this dubbing",
            )
            return _json(404, body)
        # "Now" upstream: what the next poll would report.
        if poll_phase(task.answered, sc) != "succeeded":
            body = shapes.elevenlabs_error("invalid_request", "dubbing_not_ready", "Dubbing is not finished")
            return _json(425, body, delay_s=self._latency(sc))
        if sc.media_status != 200:
            body = shapes.elevenlabs_error("not_found", "audio_not_found", "Dubbed audio is not available")
            return _json(sc.media_status, body, delay_s=self._latency(sc))
        return self._stream(task.task_id, 0, "audio", sc, req.method)

    def _tts(self, req: Request) -> Response:
        body = _json_body(req, ELEVENLABS)
        if not isinstance(body.get("text"), str) or not body["text"]:
            return _invalid(ELEVENLABS, "text is required")
        kind = "elevenlabs-sync"
        sc = self._scenario_for(
            kind, _requested_scenario(body.get("sandbox_scenario"), ELEVENLABS), ELEVENLABS
        )
        refusal = self._sync_gate(ELEVENLABS, kind, sc, req)
        if refusal is not None:
            return refusal
        if sc.outcome == "fail":
            message = sc.error_message or "Speech generation failed"
            err = shapes.elevenlabs_error("invalid_request", "generation_failed", message)
            return _json(400, err, delay_s=self._latency(sc))
        response = self._stream(f"tts-{self.state.create_count(kind)}", 0, "audio", sc, req.method)
        response.headers.update(
            {"x-character-count": str(len(body["text"])), "request-id": secrets.token_hex(12)}
        )
        return response

    # -- Anthropic ----------------------------------------------------------------------------

    def _anthropic(self, req: Request) -> Response:
        body = _json_body(req, ANTHROPIC)
        if not isinstance(body.get("model"), str) or not body["model"]:
            return _invalid(ANTHROPIC, "model: Field required")
        if not isinstance(body.get("max_tokens"), int) or isinstance(body["max_tokens"], bool):
            return _invalid(ANTHROPIC, "max_tokens: Field required")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return _invalid(ANTHROPIC, "messages: at least one message is required")
        kind = "anthropic-sync"
        sc = self._scenario_for(kind, _requested_scenario(body.get("sandbox_scenario"), ANTHROPIC), ANTHROPIC)
        refusal = self._sync_gate(ANTHROPIC, kind, sc, req)
        if refusal is not None:
            return refusal
        if sc.outcome == "fail":
            message = sc.error_message or "The request could not be completed"
            return _json(
                400, shapes.anthropic_error("invalid_request_error", message), delay_s=self._latency(sc)
            )
        reply = shapes.anthropic_message(body["model"], "Sandbox reply.", len(req.body) // 4)
        return _json(200, reply, {"request-id": "req_" + secrets.token_hex(12)}, delay_s=self._latency(sc))

    # -- media --------------------------------------------------------------------------------

    def _media(self, req: Request) -> Response:
        match = _RE_MEDIA.match(req.path)
        if match is None or req.method not in ("GET", "HEAD"):
            return _media_error(404)
        task = self.state.get(match["id"])
        if task is None:
            return _media_error(404)
        if req.method == "GET":
            self.state.count_media(task.task_id)
        sc = task.scenario
        n = int(match["n"])
        kind = "image" if match["cover"] else media_kind_for(task.family, sc)
        if n >= len(self.links(task).media) or MEDIA_TYPES[kind][0] != match["ext"]:
            return _media_error(404)
        # Failed tasks have no media; Replicate deletes outputs; Runway links expire.
        if sc.outcome != "succeed" or sc.data_removed:
            return _media_error(404)
        if sc.expired:
            return _media_error(403)
        if sc.media_status != 200:
            return _media_error(sc.media_status)
        return self._stream(task.task_id, n, kind, sc, req.method)

    def _stream(self, key: str, n: int, kind: str, sc: Scenario, method: str) -> Response:
        length = media_length(kind, sc.media_size)
        body: Iterable[bytes] = () if method == "HEAD" else iter_media(key, n, kind, sc.media_size)
        if sc.media_drip_s and method != "HEAD":
            body = self._drip(body, sc.media_drip_s)
        return Response(
            200,
            body,
            MEDIA_TYPES[kind][1],
            length=None if sc.media_no_length else length,
            delay_s=self._latency(sc),
        )

    # -- admin --------------------------------------------------------------------------------

    def _admin(self, req: Request) -> Response:
        path, method = req.path, req.method
        try:
            if path == "/_sandbox/health" and method == "GET":
                return _json(200, {"ok": True, "base_url": self.base_url})
            if path == "/_sandbox/stats" and method == "GET":
                return _json(200, self.state.stats(req.q("task_id")))
            if path == "/_sandbox/reset" and method == "POST":
                self.reset()
                return _json(200, {"ok": True})
            if path == "/_sandbox/tasks" and method == "POST":
                body = self._admin_body(req)
                kind = body.get("kind")
                get_kind(kind)
                scenario = Scenario.from_dict(body.get("scenario"))
                task = self.state.add_task(str(kind), scenario, body.get("task_id"))
                return _json(
                    201, {"task_id": task.task_id, "kind": kind, "media_urls": self.media_urls(task)}
                )
            match = _RE_ADMIN_TASK.match(path)
            if match and method == "GET":
                found = self.state.get(match["id"])
                if found is None:
                    return _json(404, {"error": f"no sandbox task {match['id']!r}"})
                return _json(200, {**found.info(), "media_urls": self.media_urls(found)})
            if path == "/_sandbox/default_scenario" and method == "POST":
                body = self._admin_body(req)
                kind = body.get("kind")
                get_kind(kind)
                raw = body.get("scenario")
                self.state.set_default(str(kind), None if raw is None else Scenario.from_dict(raw))
                return _json(200, {"ok": True})
            if path == "/_sandbox/requests" and method == "GET":
                window = req.q("window_s")
                stamps = self.state.request_times(req.q("provider"), req.q("op"), float(req.q("since") or 0))
                body = {"count": len(stamps), "timestamps": stamps}
                if window:
                    body["max_in_window"] = max_in_window(stamps, float(window))
                return _json(200, body)
            if path == "/_sandbox/creates" and method == "GET":
                contains = req.q("contains")
                if not contains:
                    return _json(400, {"error": "query parameter 'contains' is required"})
                ids = self.state.create_task_ids(contains)
                return _json(200, {"count": self.state.creates_for(contains), "task_ids": ids})
        except (ValueError, ScenarioError) as exc:
            return _json(400, {"error": str(exc)})
        return _json(404, {"error": f"no admin endpoint {method} {path}; see recon_dagster.sandbox"})

    @staticmethod
    def _admin_body(req: Request) -> Json:
        try:
            data = json.loads(req.body or b"{}")
        except ValueError as exc:
            raise BadRequest(_json(400, {"error": f"body is not valid JSON: {exc}"})) from None
        if not isinstance(data, dict):
            raise BadRequest(_json(400, {"error": "body must be a JSON object"}))
        return data

    def reset(self) -> None:
        """Forget all tasks and counters; calls held open by run_forever end now."""
        self.release.set()
        self.release = threading.Event()
        self.state.reset()


# -- socket plumbing -------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "recon-sandbox"
    sys_version = ""
    # Headers and body go out in one write, but keep small replies from waiting on Nagle.
    disable_nagle_algorithm = True
    timeout = 300
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        # Silent on purpose: request lines and headers are never logged (keys travel in headers).
        return

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _read_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            total = 0
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                total += size
                if total > MAX_BODY:
                    return None
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return None
        return self.rfile.read(length) if length else b""

    def _serve(self) -> None:
        sandbox = self.server.sandbox
        try:
            body = self._read_body()
        except ValueError:
            self._write(_json(400, {"error": "malformed request body framing"}))
            self.close_connection = True
            return
        if body is None:
            self._write(_json(413, {"error": f"request body larger than {MAX_BODY} bytes"}))
            self.close_connection = True
            return
        parts = urlsplit(self.path)
        req = Request(self.command, parts.path, parse_qs(parts.query), self.headers, body)
        response = sandbox.handle(req)
        if response.delay_s > 0:
            sandbox.release.wait(response.delay_s)
        if response.drop:
            self.close_connection = True
            return
        self._write(response)

    def _write(self, response: Response) -> None:
        head = [f"HTTP/1.1 {response.status} {self.responses.get(response.status, ('',))[0]}"]
        headers = {"Content-Type": response.content_type, **response.headers}
        chunked = False
        if isinstance(response.body, bytes | bytearray):
            headers["Content-Length"] = str(len(response.body))
        elif response.length is not None:
            headers["Content-Length"] = str(response.length)
        else:
            headers["Transfer-Encoding"] = "chunked"
            chunked = True
        headers["Date"] = self.date_time_string()
        head.extend(f"{k}: {v}" for k, v in headers.items())
        head_bytes = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        try:
            if isinstance(response.body, bytes | bytearray):
                payload = b"" if self.command == "HEAD" else bytes(response.body)
                self.wfile.write(head_bytes + payload)
                return
            self.wfile.write(head_bytes)
            for chunk in response.body:
                if chunked:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                else:
                    self.wfile.write(chunk)
            if chunked and self.command != "HEAD":
                self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)

    def track(self, conn: socket.socket, open_: bool) -> None:
        with self._conns_lock:
            if open_:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def close_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class SandboxServer:
    """A provider sandbox on loopback; start it, point clients at ``env()``, steer with scenarios.

    Use as a context manager, or ``start()``/``stop()``. Other processes steer it through the
    admin HTTP API under ``{base_url}/_sandbox/``.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, api_key: str = "sandbox-key", latency_s: float = 0.0
    ) -> None:
        if not api_key:
            raise ValueError("api_key must be a non-empty string")
        self.host = host
        self.port = port
        self.sandbox = Sandbox(api_key, latency_s)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        # The key is deliberately absent.
        return f"SandboxServer(base_url={self.base_url!r})"

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> SandboxServer:
        """Bind and serve in a background thread; returns self."""
        if self._httpd is not None:
            return self
        if self.sandbox.release.is_set():  # stopped before: held calls must hold again
            self.sandbox.release = threading.Event()
        try:
            self._httpd = _HTTPServer((self.host, self.port), self.sandbox)
        except OSError as exc:
            raise OSError(
                exc.errno, f"the sandbox cannot listen on {self.host}:{self.port}: {exc.strerror}"
            ) from None
        self.port = self._httpd.server_address[1]
        self.sandbox.base_url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"sandbox-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end calls held open, close client connections."""
        if self._httpd is None:
            return
        self.sandbox.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> SandboxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait(self) -> None:
        """Block until the server stops (used by ``serve_forever``)."""
        if self._thread is not None:
            self._thread.join()

    # -- addresses ----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the sandbox is not started: call start() or use it as a context manager")
        return self.sandbox.base_url

    @property
    def kie_base_url(self) -> str:
        return f"{self.base_url}/kie"

    @property
    def replicate_base_url(self) -> str:
        return f"{self.base_url}/replicate/v1"

    @property
    def elevenlabs_base_url(self) -> str:
        return f"{self.base_url}/elevenlabs"

    @property
    def anthropic_base_url(self) -> str:
        return f"{self.base_url}/anthropic"

    @property
    def admin_url(self) -> str:
        return f"{self.base_url}/_sandbox"

    def env(self) -> dict[str, str]:
        """Environment for clients (base URLs, keys, and the media host allow-list)."""
        key = self.sandbox.api_key
        return {
            "KIE_BASE_URL": self.kie_base_url,
            "KIE_API_KEY": key,
            "REPLICATE_BASE_URL": self.replicate_base_url,
            "REPLICATE_API_TOKEN": key,
            "ELEVENLABS_BASE_URL": self.elevenlabs_base_url,
            "ELEVENLABS_API_KEY": key,
            "ANTHROPIC_BASE_URL": self.anthropic_base_url,
            "ANTHROPIC_API_KEY": key,
            "RECON_MEDIA_ALLOWED_HOSTS": f"{self.host}:{self.port}",
        }

    # -- steering -----------------------------------------------------------------------------

    def add_task(self, kind: str, scenario: Scenario | None = None, task_id: str | None = None) -> str:
        """Seed an upstream task as if a (now dead) worker had created it; returns its id."""
        return self.sandbox.state.add_task(kind, scenario, task_id).task_id

    def set_default_scenario(self, kind: str, scenario: Scenario | None) -> None:
        """Scenario for creates/calls of ``kind`` that carry none (None: plain success)."""
        get_kind(kind)
        self.sandbox.state.set_default(kind, scenario)

    def reset(self) -> None:
        """Forget all tasks, default scenarios and counters."""
        self.sandbox.reset()

    def media_url(self, task_id: str, n: int = 0) -> str:
        """URL of media object ``n`` of a task (for dubbing: the audio endpoint)."""
        task = self.sandbox.state.get(task_id)
        if task is None:
            raise KeyError(f"no sandbox task {task_id!r}")
        urls = self.sandbox.media_urls(task)
        if not 0 <= n < len(urls):
            raise IndexError(f"task {task_id!r} has {len(urls)} media object(s), asked for #{n}")
        return urls[n]

    def task_info(self, task_id: str) -> dict[str, Any]:
        """What the sandbox knows of a task (kind, scenario, request counts)."""
        task = self.sandbox.state.get(task_id)
        if task is None:
            raise KeyError(f"no sandbox task {task_id!r}")
        return task.info()

    # -- counters -----------------------------------------------------------------------------

    def create_count(self, kind: str | None = None) -> int:
        """Creates that made an upstream task or a billable sync call (all kinds if None)."""
        if kind is not None:
            get_kind(kind)
        return self.sandbox.state.create_count(kind)

    def creates_for(self, task_id: str) -> int:
        """Creates that produced ``task_id``, or whose request body contains that string.

        Pass a job id your create bodies carry (callBackUrl, metadata) to count creates per job.
        """
        return self.sandbox.state.creates_for(task_id)

    def poll_count(self, task_id: str) -> int:
        """Poll requests for this id, including throttled ones and polls of unknown ids."""
        return self.sandbox.state.polls.get(task_id, 0)

    def requests_total(self) -> int:
        """Provider and media requests served (admin calls excluded)."""
        return self.sandbox.state.requests_total

    def request_times(self, provider: str | None = None, op: str | None = None) -> list[float]:
        """Unix times of the provider API requests of ``provider`` and ``op`` (read, create)."""
        return self.sandbox.state.request_times(provider, op)

    def media_downloads(self, task_id: str) -> int:
        """GET requests for this task's media (refused ones included)."""
        return self.sandbox.state.media.get(task_id, 0)

    def stats(self) -> dict[str, Any]:
        """All counters, as the admin ``GET stats`` returns them."""
        return self.sandbox.state.stats()


__all__ = ["Sandbox", "SandboxServer"]
