"""ElevenLabs' record of what it billed: history (one item per generation, with its ``request_id``
and the characters it took) and the account's character stats per day.

``GET /v1/history`` lists generations newest first, ``page_size`` at most 1000, narrowed by
``date_after_unix`` (inclusive) and ``date_before_unix`` (exclusive, Unix seconds), paged with
``start_after_history_item_id`` = the previous page's ``last_history_item_id`` while ``has_more``.
An item's characters are ``character_count_change_to - character_count_change_from``.
``GET /v1/usage/character-stats`` takes ``start_unix`` / ``end_unix`` in milliseconds and answers
``{"time": [ms, ...], "usage": {"<series>": [count, ...]}}``. Every page goes through the
resource's own client (``self.http``): the read limit, the poll deadline, the size cap, redaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from recon_dagster.providers.http import json_body
from recon_dagster.providers.status import ProviderProtocolError

if TYPE_CHECKING:
    from recon_dagster.providers.http import ProviderHttp

LABEL = "elevenlabs-spend"
PAGE_SIZE = 1000
# A day has far fewer pages than this; more means the cursor does not move.
MAX_PAGES = 10_000


@dataclass(frozen=True)
class HistoryItem:
    """One ElevenLabs history item: a billed generation."""

    item_id: str
    request_id: str | None
    characters: float
    at: datetime
    model: str | None = None
    source: str | None = None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value else None


def history_item(item: object) -> HistoryItem | None:
    """One listed item; None for one without an id or a time (nothing to match it by)."""
    if not isinstance(item, dict):
        return None
    item_id, at = item.get("history_item_id"), _number(item.get("date_unix"))
    if not isinstance(item_id, str) or not item_id or at is None:
        return None
    before, after = (
        _number(item.get("character_count_change_from")),
        _number(item.get("character_count_change_to")),
    )
    request = item.get("request_id")
    return HistoryItem(
        item_id=item_id,
        request_id=request if isinstance(request, str) and request else None,
        characters=abs((after or 0.0) - (before or 0.0)),
        at=datetime.fromtimestamp(at, UTC),
        model=item.get("model_id") if isinstance(item.get("model_id"), str) else None,
        source=item.get("source") if isinstance(item.get("source"), str) else None,
    )


class ElevenLabsSpend:
    """Mixed into ``ElevenLabsResource``: what the account was billed, per request and per day."""

    if TYPE_CHECKING:
        http: ProviderHttp

    def history(self, start: datetime, end: datetime, page_size: int = PAGE_SIZE) -> Iterator[HistoryItem]:
        """Every history item dated in ``[start, end)``, page by page."""
        params: dict[str, str] = {
            "page_size": str(page_size),
            "date_after_unix": str(int(start.timestamp())),
            "date_before_unix": str(int(end.timestamp())),
        }
        for _ in range(MAX_PAGES):
            page = self._page("/v1/history", params)
            items = page.get("history")
            if not isinstance(items, list):
                raise ProviderProtocolError(LABEL, f"history answer has no list 'history': {page!r:.200}")
            for raw in items:
                item = history_item(raw)
                if item is not None and start <= item.at < end:
                    yield item
            cursor = page.get("last_history_item_id")
            if not page.get("has_more") or not isinstance(cursor, str) or not cursor:
                return
            if params.get("start_after_history_item_id") == cursor:
                raise ProviderProtocolError(LABEL, f"history paging does not move past {cursor!r}")
            params["start_after_history_item_id"] = cursor
        raise ProviderProtocolError(LABEL, f"history has more than {MAX_PAGES} pages in one period")

    def character_stats(self, start: datetime, end: datetime) -> float:
        """The characters the account used in ``[start, end)``, summed over every series."""
        page = self._page(
            "/v1/usage/character-stats",
            {
                "start_unix": str(int(start.timestamp() * 1000)),
                "end_unix": str(int(end.timestamp() * 1000)),
                "aggregation_interval": "day",
            },
        )
        usage = page.get("usage")
        if not isinstance(usage, dict):
            raise ProviderProtocolError(LABEL, f"character-stats answer has no object 'usage': {page!r:.200}")
        total = 0.0
        for series in usage.values():
            if not isinstance(series, list):
                raise ProviderProtocolError(LABEL, f"character-stats series is not a list: {series!r:.120}")
            total += sum(n for n in map(_number, series) if n is not None)
        return total

    def _page(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        response = self.http.request("GET", path, label=LABEL, idempotent=True, params=params)
        body = json_body(LABEL, response)
        if not isinstance(body, dict):
            raise ProviderProtocolError(LABEL, f"{path} answer must be an object, got {body!r:.120}")
        return body
