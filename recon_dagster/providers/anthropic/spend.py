"""Anthropic's record of what it billed: the Admin API's usage report,
``GET /v1/organizations/usage_report/messages``.

Read with an Admin API key (``ANTHROPIC_ADMIN_API_KEY``, through ``dg.EnvVar``), not the key the
sync calls use; the key is optional, and without it nothing is asked. Query: ``starting_at`` /
``ending_at`` (RFC 3339), ``bucket_width=1h``, ``group_by[]=model`` and ``group_by[]=api_key_id``,
``limit`` buckets a page, ``page`` = the previous answer's ``next_page`` while ``has_more``.
Answer: ``{"data": [{"starting_at", "ending_at", "results": [{"model", "api_key_id",
"uncached_input_tokens", "cache_read_input_tokens", "cache_creation": {"ephemeral_5m_input_tokens",
"ephemeral_1h_input_tokens"}, "output_tokens", ...}]}], "has_more", "next_page"}``. Anthropic
exports usage in batches, so the newest hours fill in late (``Settings.spend_anthropic_final_after_s``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import httpx
from pydantic import Field

from recon_dagster import config
from recon_dagster.core.redaction import register_secret
from recon_dagster.providers.anthropic import ANTHROPIC_BASE_URL, AnthropicResource
from recon_dagster.providers.http import json_body
from recon_dagster.providers.limits import resource_limit_fields
from recon_dagster.providers.status import ProviderProtocolError

LABEL = "anthropic-usage"
REPORT_PATH = "/v1/organizations/usage_report/messages"
ADMIN_KEY_ENV = "ANTHROPIC_ADMIN_API_KEY"
HOURS_PER_PAGE = 168  # the most 1h buckets one page holds
MAX_PAGES = 1000


@dataclass(frozen=True)
class UsageBucket:
    """One row of the usage report: one hour, one model, one API key."""

    starting_at: datetime
    model: str
    api_key_id: str | None
    input_tokens: float
    output_tokens: float


def _tokens(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return 0.0
    return float(value)


def _time(value: object) -> datetime:
    if not isinstance(value, str) or not value:
        raise ProviderProtocolError(LABEL, f"bucket has no starting_at: {value!r:.80}")
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ProviderProtocolError(LABEL, f"bucket starting_at is not a time: {value!r:.80}") from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def usage_buckets(page: dict[str, Any]) -> list[UsageBucket]:
    """The rows of one answer page (input tokens: uncached, cache reads and cache writes)."""
    data = page.get("data")
    if not isinstance(data, list):
        raise ProviderProtocolError(LABEL, f"usage report has no list 'data': {page!r:.200}")
    out = []
    for bucket in data:
        if not isinstance(bucket, dict) or not isinstance(bucket.get("results"), list):
            raise ProviderProtocolError(LABEL, f"usage bucket without results: {bucket!r:.200}")
        at = _time(bucket.get("starting_at"))
        for row in bucket["results"]:
            if not isinstance(row, dict):
                continue
            creation = row.get("cache_creation")
            written = sum(map(_tokens, creation.values())) if isinstance(creation, dict) else 0.0
            model, key = row.get("model"), row.get("api_key_id")
            out.append(
                UsageBucket(
                    starting_at=at,
                    model=model if isinstance(model, str) and model else "unknown",
                    api_key_id=key if isinstance(key, str) and key else None,
                    input_tokens=_tokens(row.get("uncached_input_tokens"))
                    + _tokens(row.get("cache_read_input_tokens"))
                    + written,
                    output_tokens=_tokens(row.get("output_tokens")),
                )
            )
    return out


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


class AnthropicUsageResource(AnthropicResource):
    """Anthropic's Admin API (the usage report), on its own key; ``api_key`` empty: not configured."""

    api_key: str = Field(
        default="", repr=False, description=f"Admin API key; wire it as dg.EnvVar({ADMIN_KEY_ENV!r})."
    )
    read_timeout_s: float = 30.0
    report_page_hours: int = Field(default=HOURS_PER_PAGE, description="Hourly buckets asked per page.")

    @property
    def configured(self) -> bool:
        return bool(self.api_key)

    def usage_report(self, start: datetime, end: datetime) -> list[UsageBucket]:
        """Every hourly bucket in ``[start, end)``, per model and API key, page by page."""
        base: dict[str, str | list[str]] = {
            "starting_at": _iso(start),
            "ending_at": _iso(end),
            "bucket_width": "1h",
            "group_by[]": ["model", "api_key_id"],
            "limit": str(self.report_page_hours),
        }
        out: list[UsageBucket] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            # QueryParams: one mapping that keeps the repeated group_by[] keys.
            params = httpx.QueryParams({**base, **({"page": cursor} if cursor else {})})
            response = self.http.request("GET", REPORT_PATH, label=LABEL, idempotent=True, params=params)
            page = json_body(LABEL, response)
            if not isinstance(page, dict):
                raise ProviderProtocolError(LABEL, f"answer must be an object, got {page!r:.120}")
            out += usage_buckets(page)
            following = page.get("next_page")
            if not page.get("has_more") or not isinstance(following, str) or not following:
                return out
            if following == cursor:
                raise ProviderProtocolError(LABEL, f"usage report paging does not move past {cursor!r}")
            cursor = following
        raise ProviderProtocolError(LABEL, f"usage report has more than {MAX_PAGES} pages in one period")


def anthropic_usage_from_env() -> AnthropicUsageResource:
    """The usage report's resource: its key through ``dg.EnvVar`` when set, else not configured.
    A key present now is registered for masking at once, before any client is built."""
    register_secret(os.environ.get(ADMIN_KEY_ENV))
    base_url = dg.EnvVar("ANTHROPIC_BASE_URL") if config.is_set("ANTHROPIC_BASE_URL") else ANTHROPIC_BASE_URL
    api_key = dg.EnvVar(ADMIN_KEY_ENV) if config.is_set(ADMIN_KEY_ENV) else ""
    return AnthropicUsageResource(base_url=base_url, api_key=api_key, **resource_limit_fields("anthropic"))
