"""Replicate's list routes: ``GET /v1/predictions`` and ``GET /v1/trainings``, as Replicate pages them.

Newest first, ``created_after`` / ``created_before`` (ISO 8601) narrowing the list, a page of
``PAGE_SIZE`` results and a ``next`` URL carrying an opaque ``cursor`` (and the filters) while more
remain. Listing is not a poll: it never moves a task along its scenario. A listed task's status
is the one its last poll answered (``starting`` if never polled and not yet done).
"""

from __future__ import annotations

import base64
import re
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from recon_dagster.core.kinds import Family
from recon_dagster.sandbox import shapes
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.refusals import REPLICATE, invalid
from recon_dagster.sandbox.scenario import poll_phase
from recon_dagster.sandbox.state import Task
from recon_dagster.sandbox.wire import Request, Response, json_response

PAGE_SIZE = 100
_RE_LIST = re.compile(r"^/replicate/v1/(?P<coll>predictions|trainings)$")


def parse_when(value: str | None) -> float | None:
    """A filter's ISO-8601 time as unix seconds; ValueError when it is not one."""
    if value is None:
        return None
    when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    if not raw.startswith("o:"):
        raise ValueError(cursor)
    return int(raw[2:])


def listed_phase(task: Task) -> str:
    """The phase a list shows: the last poll's answer; a task never polled is running unless
    its scenario is done at once."""
    if task.answered:
        return poll_phase(task.answered - 1, task.scenario)
    return poll_phase(0, task.scenario) if task.scenario.polls_before_done == 0 else "running"


def listed_body(sb: SandboxCore, task: Task, now: float) -> dict[str, Any]:
    phase = listed_phase(task)
    sb.state.mark_times(task, phase, now)
    return shapes.poll_body(task, phase, 0, sb.links(task))


def list_tasks(sb: SandboxCore, req: Request) -> Response:
    match = _RE_LIST.match(req.path)
    assert match is not None
    family = Family.REPLICATE_TRAINING if match["coll"] == "trainings" else Family.REPLICATE_PREDICTION
    try:
        after, before = parse_when(req.q("created_after")), parse_when(req.q("created_before"))
        offset = decode_cursor(req.q("cursor") or encode_cursor(0))
    except ValueError:
        return invalid(REPLICATE, "created_after, created_before and cursor must be valid")
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
