"""The provider HTTP client, observed: each try a client span (HTTP semantic conventions) and an
answer counted by class (``recon_provider_answers``, ``recon_retry_after_blocks``), and the time the
limiters held it before it went out (``recon_limiter_wait``). ``ProviderHttp`` itself is left as
it is; the provider resources build this subclass (``providers/base.py``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import httpx

from recon_dagster.providers.http import ProviderHttp, _Transient
from recon_dagster.providers.status import NotSent, ProviderHTTPError
from recon_dagster.telemetry.instruments import LIMITER_WAIT, PROVIDER_ANSWERS, RETRY_AFTER
from recon_dagster.telemetry.tracing import SpanKind, span


def answer_class(exc: BaseException) -> str:
    """How a try that raised ended: the status class (``404`` and ``429`` on their own), or
    ``timeout`` / ``connect`` when nothing was answered."""
    code = getattr(exc, "status_code", None)
    if isinstance(exc, _Transient) or (code is None and isinstance(exc, ProviderHTTPError)):
        detail = str(exc).lower()
        return (
            "timeout" if "timeout" in detail or "timed out" in detail or "deadline" in detail else "connect"
        )
    if not isinstance(code, int) or not 100 <= code < 600:
        return "other"
    return str(code) if code in (404, 429) else f"{code // 100}xx"


class _LetOut(list[bool]):
    """The caller's ``sent`` marker, noting when the limiters let the request out."""

    def __init__(self, sent: list[bool] | None) -> None:
        super().__init__()
        self.sent = sent
        self.at: float | None = None

    def append(self, value: bool) -> None:
        self.at = time.monotonic()
        super().append(value)
        if self.sent is not None:
            self.sent.append(value)


class ObservedProviderHttp(ProviderHttp):
    def _attempt(
        self,
        method: str,
        path: str,
        label: str,
        idempotent: bool,
        json: Any,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str] | None,
        deadline: float | None = None,
        sent: list[bool] | None = None,
    ) -> httpx.Response:
        """One try as a client span: the URL without its query or credentials, no header."""
        url = httpx.URL(self.base_url + path).copy_with(query=None, fragment=None)
        attributes = {
            "http.request.method": method,
            "url.full": str(url.copy_with(username=None, password=None)),
            "server.address": url.host,
            "server.port": url.port or (443 if url.scheme == "https" else 80),
            "recon.provider": self.provider,
        }
        started = time.monotonic()
        let_out = _LetOut(sent)
        with span(method, attributes, kind=SpanKind.CLIENT) as current:
            try:
                response = super()._attempt(
                    method, path, label, idempotent, json, params, headers, deadline, let_out
                )
            except NotSent:  # never left: no answer, no wait that ended in a request
                raise
            except Exception as exc:
                self._observe_failure(exc, current)
                raise
            finally:
                if let_out.at is not None:
                    LIMITER_WAIT.record(let_out.at - started, provider=self.provider)
            PROVIDER_ANSWERS.add(1, provider=self.provider, **{"class": "2xx"})
            if current is not None:
                current.set_attribute("http.response.status_code", response.status_code)
            return response

    def _observe_failure(self, exc: Exception, current: Any) -> None:
        answer = answer_class(exc)
        PROVIDER_ANSWERS.add(1, provider=self.provider, **{"class": answer})
        if getattr(exc, "retry_after_s", None):
            RETRY_AFTER.add(1, provider=self.provider)
        if current is not None:
            code = getattr(exc, "status_code", None)
            current.set_attribute("error.type", str(code or answer))
            if isinstance(code, int):
                current.set_attribute("http.response.status_code", code)
