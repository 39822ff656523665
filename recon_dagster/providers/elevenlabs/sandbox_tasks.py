"""ElevenLabs' dubbing list and delete: ``GET /v1/dubbing`` and ``DELETE /v1/dubbing/{id}``.

The list pages ``page_size`` dubs (at most 200, default 100) ordered by ``created_at``
(``order_direction`` DESCENDING by default), ``{"dubs": [...], "next_cursor", "has_more"}``; a
``dubbing_status`` narrows it. A delete removes the dub: a running one stops, and later polls and
lists no longer show it. Listing is not a poll: it never moves a dub along its scenario.
"""

from __future__ import annotations

import re
import time

from recon_dagster.providers.elevenlabs import sandbox_shapes
from recon_dagster.providers.elevenlabs.spec import NAME, ElevenLabsFamily
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.listing import decode_cursor, encode_cursor, listed_body
from recon_dagster.sandbox.refusals import invalid
from recon_dagster.sandbox.wire import Request, Response, json_response

MAX_PAGE = 200
_RE_DUB = re.compile(r"^/elevenlabs/v1/dubbing/(?P<id>[^/]+)$")


def list_dubs(sb: SandboxCore, req: Request) -> Response:
    try:
        size = int(req.q("page_size") or 100)
        offset = decode_cursor(req.q("cursor") or encode_cursor(0))
    except ValueError:
        return invalid(NAME, "page_size and cursor must be valid")
    if not 1 <= size <= MAX_PAGE:
        return invalid(NAME, f"page_size must be 1-{MAX_PAGE}")
    dubs = sb.state.listed((ElevenLabsFamily.DUBBING,))
    if (req.q("order_direction") or "DESCENDING").upper() == "ASCENDING":
        dubs.reverse()
    now = time.time()
    rendered = [listed_body(sb, task, now) for task in dubs]
    wanted = req.q("dubbing_status")
    if wanted:
        rendered = [d for d in rendered if d["status"] == wanted]
    page = rendered[offset : offset + size]
    more = offset + size < len(rendered)
    body = {"dubs": page, "next_cursor": encode_cursor(offset + size) if more else None, "has_more": more}
    return json_response(200, body, delay_s=sb.latency_s)


def delete_dub(sb: SandboxCore, req: Request) -> Response:
    match = _RE_DUB.match(req.path)
    assert match is not None
    ticket = sb.state.task_request(match["id"], (ElevenLabsFamily.DUBBING,))
    if ticket is None or ticket.task.meta.get("deleted"):
        message = f"Dubbing {match['id']} not found"
        return json_response(404, sandbox_shapes.elevenlabs_error("not_found", "dubbing_not_found", message))
    refusal = sb.ticket_response(ticket, NAME)
    if refusal is not None:
        return refusal
    sb.state.cancel(ticket.task)
    ticket.task.meta["deleted"] = True
    return json_response(200, {"status": "ok"}, delay_s=sb.latency(ticket.task.scenario))


ROUTES = (
    Route("GET", "/elevenlabs/v1/dubbing".__eq__, list_dubs),
    Route("DELETE", _RE_DUB.match, delete_dub),
)
