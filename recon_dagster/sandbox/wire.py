"""The sandbox's provider-neutral HTTP vocabulary: a parsed request, a response to send, a refusal."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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


def json_response(
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


def bearer(header: str | None, also: tuple[str, ...] = ()) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (or one of the ``also`` schemes)."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme == "Bearer" or scheme in also else None
