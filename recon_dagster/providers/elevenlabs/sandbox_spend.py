"""ElevenLabs' billing record in the sandbox: history and character stats, made from the
text-to-speech calls the sandbox answered (each one's ``request-id`` header is the one its history
item lists, its characters those of its text), so they agree with what a client was told."""

from __future__ import annotations

import hashlib
import json

from recon_dagster.providers.elevenlabs.spec import NAME
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.refusals import invalid
from recon_dagster.sandbox.wire import Request, Response, json_response

TTS_KIND = "elevenlabs-sync"
DEFAULT_MODEL = "eleven_multilingual_v2"
_SECONDS = {"hour": 3600, "day": 86_400}


def request_id_of(n: int) -> str:
    """The ``request-id`` of the sandbox's ``n``-th text-to-speech call (from 1)."""
    return hashlib.sha256(f"{TTS_KIND}/{n}".encode()).hexdigest()[:24]


def _items(sb: SandboxCore) -> list[dict[str, object]]:
    """Every TTS call as a history item, oldest first, with the account's running character count."""
    items: list[dict[str, object]] = []
    used = 0
    for n, at, _, _, body in sb.state.creates_of(frozenset({TTS_KIND})):
        try:
            sent = json.loads(body)
        except ValueError:
            sent = {}
        text = sent.get("text") if isinstance(sent, dict) else None
        characters = len(text) if isinstance(text, str) else 0
        request_id = request_id_of(n)
        model = sent.get("model_id") if isinstance(sent, dict) else None
        items.append({
            "history_item_id": "h" + request_id[:19], "request_id": request_id,
            "voice_id": "sandbox-voice", "model_id": model if isinstance(model, str) else DEFAULT_MODEL,
            "text": text, "date_unix": int(at), "_at": at,
            "character_count_change_from": used, "character_count_change_to": used + characters,
            "content_type": "audio/mpeg", "state": "created", "source": "TTS",
        })  # fmt: skip
        used += characters
    return items


def _int(req: Request, name: str) -> int | None:
    raw = req.q(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def history(sb: SandboxCore, req: Request) -> Response:
    size = _int(req, "page_size") or 100
    if not 1 <= size <= 1000:
        return invalid(NAME, "page_size must be between 1 and 1000")
    after, before = _int(req, "date_after_unix"), _int(req, "date_before_unix")
    items = [
        i for i in reversed(_items(sb))
        if (after is None or int(i["date_unix"]) >= after) and (before is None or int(i["date_unix"]) < before)  # type: ignore[call-overload]
    ]  # fmt: skip
    cursor = req.q("start_after_history_item_id")
    if cursor:
        ids = [i["history_item_id"] for i in items]
        items = items[ids.index(cursor) + 1 :] if cursor in ids else []
    page = [{k: v for k, v in i.items() if not k.startswith("_")} for i in items[:size]]
    body = {
        "history": page,
        "last_history_item_id": page[-1]["history_item_id"] if page else None,
        "has_more": len(items) > size,
    }
    return json_response(200, body, delay_s=sb.latency_s)


def character_stats(sb: SandboxCore, req: Request) -> Response:
    start, end = _int(req, "start_unix"), _int(req, "end_unix")
    if start is None or end is None or end < start:
        return invalid(NAME, "start_unix and end_unix (milliseconds) are required, start <= end")
    width = _SECONDS.get(req.q("aggregation_interval") or "day", 86_400) * 1000
    first = start - start % width
    times = list(range(first, end, width)) or [first]
    counts = [0] * len(times)
    for item in _items(sb):
        at_ms = int(float(str(item["_at"])) * 1000)
        if start <= at_ms < end:
            characters = int(str(item["character_count_change_to"])) - int(
                str(item["character_count_change_from"])
            )
            counts[min((at_ms - first) // width, len(times) - 1)] += characters
    return json_response(200, {"time": times, "usage": {"All": counts}}, delay_s=sb.latency_s)


ROUTES = (
    Route("GET", "/elevenlabs/v1/history".__eq__, history),
    Route("GET", "/elevenlabs/v1/usage/character-stats".__eq__, character_stats),
)
