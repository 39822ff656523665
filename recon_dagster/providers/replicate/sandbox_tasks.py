"""Replicate's list routes: ``GET /v1/predictions`` and ``GET /v1/trainings``, as Replicate pages them.

Newest first, ``created_after`` / ``created_before`` (ISO 8601) narrowing the list, a page of
``PAGE_SIZE`` results and a ``next`` URL carrying an opaque ``cursor`` (and the filters) while more
remain. Listing is not a poll: it never moves a task along its scenario. A listed task's status
is the one its last poll answered (``starting`` if never polled and not yet done).
"""

from __future__ import annotations

import re
import time
from urllib.parse import urlencode

from recon_dagster.providers.replicate.spec import NAME, ReplicateFamily
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.listing import decode_cursor, encode_cursor, listed_body, parse_when
from recon_dagster.sandbox.refusals import invalid
from recon_dagster.sandbox.wire import Request, Response, json_response

PAGE_SIZE = 100
_RE_LIST = re.compile(r"^/replicate/v1/(?P<coll>predictions|trainings)$")


def list_tasks(sb: SandboxCore, req: Request) -> Response:
    match = _RE_LIST.match(req.path)
    assert match is not None
    family = ReplicateFamily.TRAINING if match["coll"] == "trainings" else ReplicateFamily.PREDICTION
    try:
        after, before = parse_when(req.q("created_after")), parse_when(req.q("created_before"))
        offset = decode_cursor(req.q("cursor") or encode_cursor(0))
    except ValueError:
        return invalid(NAME, "created_after, created_before and cursor must be valid")
    tasks = [
        t
        for t in sb.state.listed((family,))
        if (after is None or t.created_at >= after) and (before is None or t.created_at < before)
    ]
    page = tasks[offset : offset + PAGE_SIZE]
    now = time.time()
    results = [listed_body(sb, task, now) for task in page]
    more = offset + PAGE_SIZE < len(tasks)
    query = {
        k: v
        for k, v in (("created_after", req.q("created_after")), ("created_before", req.q("created_before")))
        if v
    }
    base = f"{sb.base_url}{req.path}"
    next_url = f"{base}?{urlencode({**query, 'cursor': encode_cursor(offset + PAGE_SIZE)})}" if more else None
    previous = (
        f"{base}?{urlencode({**query, 'cursor': encode_cursor(max(0, offset - PAGE_SIZE))})}"
        if offset
        else None
    )
    body = {"next": next_url, "previous": previous, "results": results}
    return json_response(200, body, delay_s=sb.latency_s)


ROUTES = (Route("GET", _RE_LIST.match, list_tasks),)
