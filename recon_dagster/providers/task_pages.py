"""What every provider's list walk shares: the providers' time stamps, and a bound on the walk.

A provider package's ``tasks`` module pages through its list endpoint with these, so a walk that
loops on one cursor or runs past ``MAX_PAGES`` stops with an error naming the provider, instead of
hanging a sweep or being taken for the whole window.
"""

from __future__ import annotations

from datetime import UTC, datetime

from recon_dagster.providers.status import ProviderProtocolError

# The most pages one list walk reads (100 tasks a page on Replicate, 200 on ElevenLabs).
MAX_PAGES = 2000


def parse_time(value: object) -> datetime | None:
    """An ISO-8601 time as the providers write it (``Z`` or an offset), in UTC; None if absent."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def iso(when: datetime) -> str:
    """``when`` in UTC as the providers' filters take it (``...Z``)."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def check_page(provider: str, cursor: str, seen: set[str]) -> None:
    """Refuse a page already read, or one past ``MAX_PAGES``: the walk stops with an error naming
    ``provider`` (a provider or proxy answering the same cursor forever never hangs a sweep, and a
    walk cut short is never taken for the whole window)."""
    if cursor in seen:
        raise ProviderProtocolError(
            provider, f"list cursor repeats after {len(seen)} pages: {cursor[:120]!r}"
        )
    if len(seen) >= MAX_PAGES:
        raise ProviderProtocolError(
            provider, f"list longer than {MAX_PAGES} pages; narrow the window (--since)"
        )
    seen.add(cursor)
