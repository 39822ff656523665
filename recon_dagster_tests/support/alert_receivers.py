"""Loopback receivers that speak each alert target's real protocol, for the alert tests.

One HTTP server on 127.0.0.1 with a path per service; each validates a request as the service
does and answers as it does:

- ``/slack/services/T0/B0/<token>``: a Slack incoming webhook. JSON with ``text`` or ``blocks``
  (blocks of known types; a header's plain text at most 150 characters), else ``400
  invalid_payload`` / ``no_text``; ``200 ok`` (text/plain) when accepted.
- ``/pagerduty/v2/enqueue``: PagerDuty Events API v2. ``routing_key`` (32 characters),
  ``event_action`` trigger / acknowledge / resolve, ``dedup_key`` up to 255 characters (required to
  resolve), and for a trigger ``payload.summary`` (up to 1024), ``payload.source`` and
  ``payload.severity`` (critical, error, warning, info); else ``400 {"status": "invalid event"}``;
  ``202 {"status": "success", "message": "Event processed", "dedup_key": ...}`` when accepted.
- ``/teams/workflows/<id>``: a Teams Workflows "When a Teams webhook request is received" trigger.
  A ``message`` whose ``attachments`` each carry an Adaptive Card
  (``application/vnd.microsoft.card.adaptive``, ``type: AdaptiveCard``, a ``version`` and a
  ``body`` list); else ``400``; ``202`` with no body when accepted.
- ``/hook/<anything>``: a generic JSON receiver; with ``secret`` set it checks
  ``X-Recon-Signature`` (``sha256=`` HMAC of the body) and answers ``401`` on a mismatch.

``fail_next(path_prefix, n, status)`` makes the next ``n`` requests under a prefix fail (a
receiver that is down), to test redelivery; ``hang(path_prefix)`` makes every request under it
wait without an answer (a receiver that accepts the connection and never answers) until
``answer_again(path_prefix)`` or the receivers close; such a request is recorded with status 0.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ROUTING_KEY = "R0UT1NGKEY0123456789abcdefABCDEF"  # 32 characters, as PagerDuty's are
_SLACK_BLOCKS = {"header", "section", "context", "divider", "actions", "image", "rich_text"}
_PD_SEVERITIES = {"critical", "error", "warning", "info"}


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receivers:
    base: str
    secret: str | None = None
    received: list[Received] = field(default_factory=list)
    failing: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hanging: dict[str, threading.Event] = field(default_factory=dict)
    closed: threading.Event = field(default_factory=threading.Event)

    def hang(self, prefix: str) -> None:
        with self.lock:
            self.hanging[prefix] = threading.Event()

    def answer_again(self, prefix: str) -> None:
        with self.lock:
            released = self.hanging.pop(prefix, None)
        if released is not None:
            released.set()

    def _hang_if_asked(self, path: str) -> bool:
        """Wait while ``path`` hangs; True when it did (the request then gets no answer)."""
        with self.lock:
            events = [e for prefix, e in self.hanging.items() if path.startswith(prefix)]
        if not events:
            return False
        while not (events[0].is_set() or self.closed.is_set()):
            events[0].wait(0.2)
        return True

    @property
    def slack_url(self) -> str:
        return f"{self.base}/slack/services/T0/B0/slacktoken0123456789"

    @property
    def pagerduty_url(self) -> str:
        return f"{self.base}/pagerduty/v2/enqueue"

    @property
    def teams_url(self) -> str:
        return f"{self.base}/teams/workflows/5c0ffee/triggers/manual/paths/invoke?sig=teamssig0123456789"

    @property
    def webhook_url(self) -> str:
        return f"{self.base}/hook/recon?token=hooktoken0123456789"

    def env(self) -> dict[str, str]:
        env = {
            "RECON_ALERT_SLACK_WEBHOOK_URL": self.slack_url,
            "RECON_ALERT_PAGERDUTY_ROUTING_KEY": ROUTING_KEY,
            "RECON_ALERT_PAGERDUTY_URL": self.pagerduty_url,
            "RECON_ALERT_TEAMS_WEBHOOK_URL": self.teams_url,
            "RECON_ALERT_WEBHOOK_URL": self.webhook_url,
        }
        if self.secret:
            env["RECON_ALERT_WEBHOOK_SECRET"] = self.secret
        return env

    def fail_next(self, prefix: str, n: int, status: int = 503) -> None:
        with self.lock:
            self.failing[prefix] = [status] * n

    def accepted(self, prefix: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path.startswith(prefix) and 0 < r.status < 300]

    def _forced(self, path: str) -> int | None:
        with self.lock:
            for prefix, statuses in self.failing.items():
                if path.startswith(prefix) and statuses:
                    return statuses.pop(0)
        return None


def _slack(data: Any) -> tuple[int, str, bytes]:
    if not isinstance(data, dict):
        return 400, "text/plain", b"invalid_payload"
    blocks = data.get("blocks")
    if not data.get("text") and not blocks:
        return 400, "text/plain", b"no_text"
    for block in blocks or []:
        if block.get("type") not in _SLACK_BLOCKS:
            return 400, "text/plain", b"invalid_blocks"
        if block["type"] == "header":
            text = block.get("text", {})
            if text.get("type") != "plain_text" or not 0 < len(text.get("text", "")) <= 150:
                return 400, "text/plain", b"invalid_blocks"
    return 200, "text/plain", b"ok"


def _pagerduty(data: Any) -> tuple[int, str, bytes]:
    errors = []
    if not isinstance(data, dict):
        errors.append("Event object is invalid")
        data = {}
    if not isinstance(data.get("routing_key"), str) or len(data["routing_key"]) != 32:
        errors.append("'routing_key' must be 32 characters")
    action = data.get("event_action")
    if action not in ("trigger", "acknowledge", "resolve"):
        errors.append("'event_action' is invalid")
    dedup = data.get("dedup_key")
    if dedup is not None and (not isinstance(dedup, str) or len(dedup) > 255):
        errors.append("'dedup_key' must be at most 255 characters")
    if action in ("acknowledge", "resolve") and not dedup:
        errors.append("'dedup_key' is required to acknowledge or resolve")
    if action == "trigger":
        payload = data.get("payload") or {}
        if not isinstance(payload.get("summary"), str) or not 0 < len(payload["summary"]) <= 1024:
            errors.append("'payload.summary' is required (at most 1024 characters)")
        if not payload.get("source"):
            errors.append("'payload.source' is required")
        if payload.get("severity") not in _PD_SEVERITIES:
            errors.append("'payload.severity' is invalid")
    if errors:
        body = {"status": "invalid event", "message": "Event object is invalid", "errors": errors}
        return 400, "application/json", json.dumps(body).encode()
    body = {"status": "success", "message": "Event processed", "dedup_key": dedup or "generated"}
    return 202, "application/json", json.dumps(body).encode()


def _teams(data: Any) -> tuple[int, str, bytes]:
    ok = (
        isinstance(data, dict) and data.get("type") == "message" and isinstance(data.get("attachments"), list)
    )
    for att in data.get("attachments", []) if ok else []:
        card = att.get("content") or {}
        ok = ok and (
            att.get("contentType") == "application/vnd.microsoft.card.adaptive"
            and card.get("type") == "AdaptiveCard"
            and isinstance(card.get("version"), str)
            and isinstance(card.get("body"), list)
            and all(isinstance(el, dict) and "type" in el for el in card["body"])
        )
    if not ok or not data.get("attachments"):
        return 400, "application/json", b'{"error": {"code": "InvalidRequestContent"}}'
    return 202, "text/plain", b""


@contextmanager
def alert_receivers(secret: str | None = None) -> Iterator[Receivers]:
    state: dict[str, Receivers] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            receivers = state["r"]
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if receivers._hang_if_asked(self.path):
                with receivers.lock:
                    receivers.received.append(Received(self.path, dict(self.headers.items()), body, 0))
                self.close_connection = True
                return
            forced = receivers._forced(self.path)
            try:
                data = json.loads(body)
            except ValueError:
                data = None
            if forced is not None:
                status, ctype, answer = forced, "text/plain", b"unavailable"
            elif self.path.startswith("/slack/"):
                status, ctype, answer = _slack(data)
            elif self.path.startswith("/pagerduty/"):
                status, ctype, answer = _pagerduty(data)
            elif self.path.startswith("/teams/"):
                status, ctype, answer = _teams(data)
            elif self.path.startswith("/hook/"):
                status, ctype, answer = 200, "application/json", b'{"ok": true}'
                if receivers.secret:
                    expected = (
                        "sha256=" + hmac.new(receivers.secret.encode(), body, hashlib.sha256).hexdigest()
                    )
                    if not hmac.compare_digest(self.headers.get("x-recon-signature", ""), expected):
                        status, answer = 401, b'{"error": "bad signature"}'
            else:
                status, ctype, answer = 404, "text/plain", b"no_service"
            with receivers.lock:
                receivers.received.append(Received(self.path, dict(self.headers.items()), body, status))
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state["r"] = Receivers(f"http://127.0.0.1:{server.server_address[1]}", secret=secret)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["r"]
    finally:
        state["r"].closed.set()
        server.shutdown()
        server.server_close()
