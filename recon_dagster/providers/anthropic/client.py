"""Anthropic Messages API (sync only: nothing to poll)."""

from __future__ import annotations

from typing import Any, ClassVar

import httpx
from pydantic import Field

from recon_dagster.providers.anthropic.spec import NAME, SPEC
from recon_dagster.providers.base import ProviderResource
from recon_dagster.providers.http import json_body
from recon_dagster.providers.status import ProviderProtocolError

ANTHROPIC_BASE_URL = SPEC.settings.base_url


def anthropic_error_message(response: httpx.Response) -> str | None:
    """``{"type":"error","error":{"type","message"}}``."""
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return f"{error.get('type') or 'error'}: {error['message']}"
    return None


class AnthropicResource(ProviderResource):
    """Anthropic client for ``anthropic-sync`` (429 ``rate_limit_error`` and 529 ``overloaded_error``
    are retried, honouring ``retry-after``)."""

    PROVIDER: ClassVar[str] = NAME

    base_url: str = Field(default=ANTHROPIC_BASE_URL, description="Anthropic API base URL.")
    # Generation can take minutes; the read timeout bounds one response.
    read_timeout_s: float = 300.0
    anthropic_version: str = "2023-06-01"

    def _auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key, "anthropic-version": self.anthropic_version}

    def _error_message(self, response: httpx.Response) -> str | None:
        return anthropic_error_message(response)

    def messages(
        self, model: str, messages: list[dict[str, Any]], max_tokens: int, **options: Any
    ) -> dict[str, Any]:
        """``POST /v1/messages``; returns the message object."""
        if not isinstance(model, str) or not model:
            raise ValueError(f"anthropic-sync: model must be a non-empty string, got {model!r}")
        if not isinstance(messages, list) or not messages:
            raise ValueError("anthropic-sync: messages must be a non-empty list")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"anthropic-sync: max_tokens must be a positive integer, got {max_tokens!r}")
        response = self.http.request(
            "POST", "/v1/messages", label="anthropic-sync", idempotent=False,
            json={"model": model, "messages": messages, "max_tokens": max_tokens, **options},
        )  # fmt: skip
        body = json_body("anthropic-sync", response)
        if not isinstance(body, dict):
            raise ProviderProtocolError("anthropic-sync", f"answer must be an object, got {body!r:.120}")
        return body
