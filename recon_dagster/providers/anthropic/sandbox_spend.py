"""Anthropic's billing record in the sandbox: the Admin API's usage report, made from the Messages
calls the sandbox answered (each one's tokens as its answer's ``usage`` said), in hourly or daily
buckets per model and API key, paged. Anthropic exports usage in batches: a call younger than
``state.spend["anthropic_report_lag_s"]`` (default 0) is not in the report yet."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from recon_dagster.providers.anthropic.spec import NAME
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.refusals import invalid
from recon_dagster.sandbox.wire import Request, Response, json_response

SYNC_KIND = "anthropic-sync"
# What every sandbox Messages call answers (its tokens are what the usage report counts).
REPLY_TEXT = "Sandbox reply."
API_KEY_ID = "apikey_sandbox"
WIDTHS = {"1h": timedelta(hours=1), "1d": timedelta(days=1)}
MAX_LIMIT = {"1h": 168, "1d": 31}


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def _calls(sb: SandboxCore) -> list[tuple[datetime, str, int, int]]:
    """(time, model, input tokens, output tokens) of each Messages call the report shows now."""
    shown_before = time.time() - sb.state.spend.get("anthropic_report_lag_s", 0.0)
    out = []
    for _, at, _, _, body in sb.state.creates_of(frozenset({SYNC_KIND})):
        if at > shown_before:
            continue
        try:
            sent = json.loads(body)
        except ValueError:
            continue
        model = sent.get("model") if isinstance(sent, dict) else None
        if isinstance(model, str):
            out.append((datetime.fromtimestamp(at, UTC), model, len(body) // 4, len(REPLY_TEXT.split())))
    return out


def _row(model: str | None, key: str | None, tokens_in: int, tokens_out: int) -> dict[str, Any]:
    return {
        "uncached_input_tokens": tokens_in, "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
        "output_tokens": tokens_out, "server_tool_use": {"web_search_requests": 0},
        "model": model, "api_key_id": key, "workspace_id": None, "service_tier": None,
        "context_window": None, "inference_geo": None,
    }  # fmt: skip


def usage_report(sb: SandboxCore, req: Request) -> Response:
    start, end = _time(req.q("starting_at")), _time(req.q("ending_at"))
    width_name = req.q("bucket_width") or "1d"
    if start is None or width_name not in WIDTHS:
        return invalid(NAME, "starting_at (RFC 3339) is required; bucket_width is 1h or 1d")
    width = WIDTHS[width_name]
    try:
        limit = min(int(req.q("limit") or MAX_LIMIT[width_name]), MAX_LIMIT[width_name])
        first = int((req.q("page") or "page_0").removeprefix("page_"))
    except ValueError:
        return invalid(NAME, "limit must be a whole number and page a next_page token")
    group_by = set(req.query.get("group_by[]", []))
    end = end or start + limit * width
    calls = _calls(sb)
    starts = []
    at = start
    while at < end:
        starts.append(at)
        at += width
    data = []
    for bucket in starts[first : first + limit]:
        sums: dict[tuple[str | None, str | None], list[int]] = {}
        for when, model, tokens_in, tokens_out in calls:
            if bucket <= when < bucket + width:
                key = (
                    model if "model" in group_by else None,
                    API_KEY_ID if "api_key_id" in group_by else None,
                )
                total = sums.setdefault(key, [0, 0])
                total[0] += tokens_in
                total[1] += tokens_out
        results = [_row(m, k, t[0], t[1]) for (m, k), t in sorted(sums.items(), key=str)]
        data.append({"starting_at": _iso(bucket), "ending_at": _iso(bucket + width), "results": results})
    more = first + limit < len(starts)
    body = {"data": data, "has_more": more, "next_page": f"page_{first + limit}" if more else None}
    return json_response(200, body, delay_s=sb.latency_s)


ROUTES = (Route("GET", "/anthropic/v1/organizations/usage_report/messages".__eq__, usage_report),)
