"""How a create carries its job marker, and what the worker library's create hook looks like.

The create ledger (``db/ledger.py``) records every create before it is sent; the provider resource
puts the create's marker where the provider echoes it back (a query parameter on a webhook or
callback URL, a dubbing's name), so the orphan sweep can tell our tasks at the provider from
anyone else's even when no task id was ever recorded. A provider with no such place sends the
request unmarked: its tasks are matched by task id, or by fingerprint within the create's window.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import httpx

MARKER_PARAM = "recon_create"


def with_marker_param(url: object, marker: str) -> str | None:
    """``url`` with the marker as its ``recon_create`` query parameter (replacing one already
    there); None when ``url`` is not an absolute http(s) URL (there is no place for it)."""
    if not isinstance(url, str) or not url:
        return None
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return None
    return str(parsed.copy_set_param(MARKER_PARAM, marker))


def marker_param(url: object) -> str | None:
    """The marker a webhook / callback URL carries, or None."""
    if not isinstance(url, str) or not url:
        return None
    try:
        found = httpx.URL(url).params.get(MARKER_PARAM)
    except httpx.InvalidURL:
        return None
    return found if isinstance(found, str) else None


def mark_url_field(payload: dict[str, Any], key: str, marker: str) -> dict[str, Any] | None:
    """A copy of ``payload`` whose URL field ``key`` carries the marker; None without such a URL."""
    marked = with_marker_param(payload.get(key), marker)
    return None if marked is None else {**payload, key: marked}


@runtime_checkable
class CreateLedgerHook(Protocol):
    """What ``AsyncProviderResource.run`` asks of an ``on_task_created`` callback that keeps the
    create ledger (the worker library's): record the create before it is sent, and how it ended
    when no task id came back. The task id itself reaches the callback as always."""

    def before_send(self, provider: str, kind: str, payload: dict[str, Any], marker_sent: bool) -> str:
        """Record the intent; returns the marker to put on the request."""
        ...

    def unanswered(self, error: BaseException) -> None:
        """The create raised: record it as ambiguous or refused (never raises)."""
        ...
