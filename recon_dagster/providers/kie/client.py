"""KIE.ai: market jobs, Veo, Suno, Flux Kontext, Runway, Luma (async) and the LLM proxy (sync)."""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote

import httpx
from pydantic import Field

from recon_dagster.providers.base import AsyncProviderResource
from recon_dagster.providers.http import json_body
from recon_dagster.providers.kie.parse import KIE_RETRYABLE_CODES, KieEnvelopeError, kie_envelope_message
from recon_dagster.providers.kie.spec import NAME, SPEC, KieFamily
from recon_dagster.providers.kie.spend import KieSpend
from recon_dagster.providers.kie.tasks import KieTasks
from recon_dagster.providers.parse import parse_poll_response
from recon_dagster.providers.status import ProviderHTTPError, ProviderProtocolError, UpstreamStatus

KIE_BASE_URL = SPEC.settings.base_url

# (create path, poll path) per family; each kind maps to exactly one pair (docs/design.md, "Kinds").
KIE_ENDPOINTS: dict[str, tuple[str, str]] = {
    KieFamily.MARKET: ("/api/v1/jobs/createTask", "/api/v1/jobs/recordInfo"),
    KieFamily.VEO: ("/api/v1/veo/generate", "/api/v1/veo/record-info"),
    KieFamily.SUNO: ("/api/v1/generate", "/api/v1/generate/record-info"),
    KieFamily.KONTEXT: ("/api/v1/flux/kontext/generate", "/api/v1/flux/kontext/record-info"),
    KieFamily.RUNWAY: ("/api/v1/runway/generate", "/api/v1/runway/record-detail"),
    KieFamily.LUMA: ("/api/v1/modify/generate", "/api/v1/modify/record-info"),
}


def _safe_json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


class KieResource(KieSpend, KieTasks, AsyncProviderResource):
    """KIE.ai client: ``create``/``poll``/``run``/``resume`` for the async kinds, ``chat`` for kie-llm.

    KIE reports most errors as HTTP 200 with an error ``code`` in its envelope; throttling and
    server codes there are retried like HTTP 429/5xx.
    """

    PROVIDER: ClassVar[str] = NAME

    base_url: str = Field(default=KIE_BASE_URL, description="KIE API base URL.")
    # KIE: about 20 new generation requests per 10 s per account; excess is rejected, not queued.
    # A bucket admits at most burst + rate * 10 s in any 10 s window: 5 + 15 = 20.
    create_rate_per_s: float | None = 1.5
    create_burst: int = 5
    llm_chat_path: str = Field(
        default="/{model}/v1/chat/completions",
        description="Chat-completions path of KIE's LLM proxy; {model} is replaced by the model name.",
    )

    def _error_message(self, response: httpx.Response) -> str | None:
        body = _safe_json(response)
        return kie_envelope_message(body) if isinstance(body, dict) else None

    def _envelope_check(self, response: httpx.Response) -> tuple[int, str] | None:
        body = _safe_json(response)
        if isinstance(body, dict):
            code = body.get("code")
            if isinstance(code, int) and not isinstance(code, bool) and code in KIE_RETRYABLE_CODES:
                return code, kie_envelope_message(body) or f"KIE envelope code {code}"
        return None

    def create(self, kind: str, payload: dict[str, Any]) -> str:
        """POST the family's generate endpoint; returns ``data.taskId``."""
        family = self._kind(kind).family
        required = ("model", "input") if family == KieFamily.MARKET else ()
        body = self._check_payload(kind, payload, required)
        response = self.http.request(
            "POST", KIE_ENDPOINTS[family][0], label=kind, idempotent=False, json=body
        )
        envelope = json_body(kind, response)
        if not isinstance(envelope, dict):
            raise ProviderProtocolError(kind, f"create answer must be an object, got {envelope!r:.120}")
        code = envelope.get("code")
        if code != 200:
            raise ProviderHTTPError(
                kind,
                code if isinstance(code, int) else None,
                kie_envelope_message(envelope) or "create rejected",
            )
        data = envelope.get("data")
        task_id = data.get("taskId") if isinstance(data, dict) else None
        if not isinstance(task_id, str) or not task_id:
            raise ProviderProtocolError(kind, f"create answer has no data.taskId: {envelope!r:.200}")
        return task_id

    def poll(self, kind: str, task_id: str) -> UpstreamStatus:
        """GET the family's record-info endpoint and parse it."""
        family = self._kind(kind).family
        # KIE answers an unknown task in its envelope (422 "recordInfo is null"), which the parser
        # maps; an HTTP 404 from KIE means a wrong endpoint, so it stays an error.
        response = self.http.request(
            "GET", KIE_ENDPOINTS[family][1], label=kind, idempotent=True, params={"taskId": task_id}
        )
        try:
            return parse_poll_response(kind, json_body(kind, response), task_id=task_id)
        except KieEnvelopeError as exc:
            # Not a task state: auth, credits, a bad request. Report it as the error it is.
            raise ProviderHTTPError(kind, exc.code, exc.message or "KIE error") from None

    def chat(self, model: str, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
        """One chat-completions round trip through KIE's LLM proxy (``kie-llm``, synchronous)."""
        if not isinstance(model, str) or not model:
            raise ValueError(f"kie-llm: model must be a non-empty string, got {model!r}")
        if not isinstance(messages, list) or not messages:
            raise ValueError("kie-llm: messages must be a non-empty list")
        path = self.llm_chat_path.replace("{model}", quote(model, safe="/"))
        response = self.http.request(
            "POST", path, label="kie-llm", idempotent=False,
            json={"model": model, "messages": messages, "stream": False, **options},
        )  # fmt: skip
        body = json_body("kie-llm", response)
        if not isinstance(body, dict):
            raise ProviderProtocolError("kie-llm", f"answer must be an object, got {body!r:.120}")
        code = body.get("code")
        if "choices" not in body and isinstance(code, int) and code != 200:
            raise ProviderHTTPError("kie-llm", code, kie_envelope_message(body) or "KIE error")
        return body
