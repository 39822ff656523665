"""ElevenLabs: dubbing (async) and text-to-speech (sync)."""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote

import httpx
from pydantic import Field

from recon_dagster.providers.base import AsyncProviderResource
from recon_dagster.providers.elevenlabs.spec import NAME, SPEC
from recon_dagster.providers.elevenlabs.spend import ElevenLabsSpend
from recon_dagster.providers.elevenlabs.tasks import ElevenLabsTasks
from recon_dagster.providers.http import json_body
from recon_dagster.providers.parse import parse_poll_response
from recon_dagster.providers.status import ProviderProtocolError, UpstreamStatus

ELEVENLABS_BASE_URL = SPEC.settings.base_url


def elevenlabs_error_message(response: httpx.Response) -> str | None:
    """ElevenLabs errors: ``{"detail": {"type","code","message"}}`` (sometimes ``detail`` is text)."""
    try:
        body = response.json()
    except ValueError:
        return None
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, dict):
        message, code = detail.get("message"), detail.get("code") or detail.get("status")
        if message:
            return f"{code}: {message}" if code else str(message)
    if isinstance(detail, str):
        return detail
    return None


class ElevenLabsResource(ElevenLabsSpend, ElevenLabsTasks, AsyncProviderResource):
    """ElevenLabs client: ``elevenlabs-async`` dubbing and ``text_to_speech`` (``elevenlabs-sync``).

    Finished dubbings are bytes on ElevenLabs' own API, not signed URLs: their ``MediaRef`` has
    ``needs_auth`` and ``media_headers`` supplies the key for that host only.
    """

    PROVIDER: ClassVar[str] = NAME

    base_url: str = Field(default=ELEVENLABS_BASE_URL, description="ElevenLabs API base URL.")
    max_concurrency: int = Field(default=8, description="ElevenLabs limits concurrent requests per plan.")

    def _auth_headers(self, api_key: str) -> dict[str, str]:
        return {"xi-api-key": api_key}

    def _error_message(self, response: httpx.Response) -> str | None:
        return elevenlabs_error_message(response)

    def create(self, kind: str, payload: dict[str, Any]) -> str:
        """``POST /v1/dubbing`` (JSON ``{source_url, target_lang, ...}``); returns ``dubbing_id``."""
        self._kind(kind)
        body = self._check_payload(kind, payload, ("source_url", "target_lang"))
        response = self.http.request("POST", "/v1/dubbing", label=kind, idempotent=False, json=body)
        answer = json_body(kind, response)
        task_id = answer.get("dubbing_id") if isinstance(answer, dict) else None
        if not isinstance(task_id, str) or not task_id:
            raise ProviderProtocolError(kind, f"create answer has no dubbing_id: {answer!r:.200}")
        return task_id

    def poll(self, kind: str, task_id: str) -> UpstreamStatus:
        """``GET /v1/dubbing/{id}``, parsed; media refs made absolute on this base URL."""
        self._kind(kind)
        body = self._poll_get(kind, f"/v1/dubbing/{quote(task_id, safe='')}", task_id)
        if isinstance(body, UpstreamStatus):
            return body
        status = parse_poll_response(kind, body, task_id=task_id)
        if not status.media:
            return status
        base = self.resolved_base_url()
        media = tuple(
            m.model_copy(update={"url": base + m.url}) if m.url.startswith("/") else m for m in status.media
        )
        return status.model_copy(update={"media": media})

    def text_to_speech(self, voice_id: str, text: str, **options: Any) -> bytes:
        """``POST /v1/text-to-speech/{voice_id}``: the audio bytes (``elevenlabs-sync``)."""
        if not isinstance(voice_id, str) or not voice_id:
            raise ValueError(f"elevenlabs-sync: voice_id must be a non-empty string, got {voice_id!r}")
        if not isinstance(text, str) or not text:
            raise ValueError("elevenlabs-sync: text must be a non-empty string")
        response = self.http.request(
            "POST", f"/v1/text-to-speech/{quote(voice_id, safe='')}", label="elevenlabs-sync",
            idempotent=False, json={"text": text, **options}, headers={"accept": "audio/mpeg"},
        )  # fmt: skip
        if not response.content:
            raise ProviderProtocolError("elevenlabs-sync", "text-to-speech answered with no audio")
        return response.content
