"""fal.ai's queue: submit, status, result and cancel for every fal model (``fal-image``, ``fal-video``).

A fal model id is ``{owner}/{app}`` plus an optional endpoint path (``fal-ai/flux/dev``,
``fal-ai/kling-video/v2/master/text-to-video``), with a namespace in front for some apps
(``workflows/...``, ``comfy/...``). Submit posts to the whole id; status, result and cancel use
only the app (``{owner}/{app}``, namespace included): fal's queue reference says so, and its
``status_url``/``response_url``/``cancel_url`` are built that way.

Our task id carries the app, since a poll knows nothing else: ``{app with ':' for '/'}:{request_id}``
(``fal-ai:flux:764cabcf-...``). It is what ``create`` returns and what the worker library records.

Retries. We do not send ``x-fal-no-retry``: fal's queue retries a request whose runner failed
transiently inside the same request id (one request, billed once, 5xx failures not billed), which
is what a reconciler wants; polls and result reads are GETs, retried by our own HTTP policy.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar
from urllib.parse import quote

import httpx
from pydantic import Field

from recon_dagster.providers.base import AsyncProviderResource
from recon_dagster.providers.fal.ids import app_of, split_task_id, task_id_for
from recon_dagster.providers.fal.parse import COMPLETED, fal_error, parse_fal
from recon_dagster.providers.fal.spec import NAME, SPEC
from recon_dagster.providers.http import ProviderNotFound, json_body
from recon_dagster.providers.parse import Body, text_of
from recon_dagster.providers.status import (
    ProviderHTTPError,
    ProviderProtocolError,
    UpstreamState,
    UpstreamStatus,
)
from recon_dagster.providers.upstream_tasks import CancelResult

FAL_BASE_URL = SPEC.settings.base_url
LIFECYCLE_HEADER = "X-Fal-Object-Lifecycle-Preference"
# The collection name ``cancel_task`` is given (fal has one queue per app, no collections).
QUEUE_COLLECTION = "queue"


def fal_error_message(response: httpx.Response) -> str | None:
    """fal errors: ``{"detail": ...}`` (text or a validation list) or ``{"error": ...}``, typed by
    ``error_type`` and the ``X-Fal-Error-Type`` header; the cancel endpoint answers ``{"status"}``."""
    header: str | None = response.headers.get("x-fal-error-type")
    try:
        body = response.json()
    except ValueError:
        return header
    if not isinstance(body, dict):
        return header
    detail, status = body.get("detail"), body.get("status")
    message = text_of(body.get("error")) or (detail if isinstance(detail, str) else text_of(detail))
    error_type = text_of(body.get("error_type")) or header
    if message and error_type:
        return f"{error_type}: {message}"
    return message or error_type or (status if isinstance(status, str) else None)


class FalResource(AsyncProviderResource):
    """fal queue client: ``fal-image`` and ``fal-video``; it can cancel a request (``TaskCancelling``)."""

    PROVIDER: ClassVar[str] = NAME

    base_url: str = Field(default=FAL_BASE_URL, description="fal queue base URL.")

    def _auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Key {api_key}"}

    def _error_message(self, response: httpx.Response) -> str | None:
        return fal_error_message(response)

    def create(self, kind: str, payload: dict[str, Any]) -> str:
        """``POST /{model}`` with the model's input as the body; returns our task id.

        ``payload``: ``{model: "owner/app[/path]", input: {...}}``. The request asks fal to keep
        its media for the kind's ``media_url_ttl`` (twice its stale threshold at least).
        """
        pk = self._kind(kind)
        body = self._check_payload(kind, payload, ("model", "input"))
        model, model_input = body["model"], body["input"]
        app = app_of(model)
        if not isinstance(model_input, dict):
            raise ValueError(f"{kind}: input must be an object, got {model_input!r:.80}")
        headers = {}
        if pk.media_url_ttl is not None:
            lifetime = {"expiration_duration_seconds": int(pk.media_url_ttl.total_seconds())}
            headers[LIFECYCLE_HEADER] = json.dumps(lifetime)
        path = "/" + "/".join(quote(part, safe="") for part in model.split("/"))
        response = self.http.request(
            "POST", path, label=kind, idempotent=False, json=model_input, headers=headers
        )
        answer = json_body(kind, response)
        request_id = answer.get("request_id") if isinstance(answer, dict) else None
        if not isinstance(request_id, str) or not request_id or ":" in request_id or "/" in request_id:
            raise ProviderProtocolError(kind, f"submit answer has no usable request_id: {answer!r:.200}")
        return task_id_for(app, request_id)

    def _request_path(self, app: str, request_id: str, suffix: str = "") -> str:
        app_path = "/".join(quote(part, safe="") for part in app.split("/"))
        return f"/{app_path}/requests/{quote(request_id, safe='')}{suffix}"

    def poll(self, kind: str, task_id: str) -> UpstreamStatus:
        """``GET …/requests/{id}/status``; when ``COMPLETED`` without an error, also the result."""
        self._kind(kind)
        try:
            app, request_id = split_task_id(kind, task_id)
        except ValueError as exc:
            # Not an id fal ever gave us (ours carry the app): no request of fal's has it, as a
            # provider's 404 says of an id it never issued.
            return UpstreamStatus(
                provider_kind=kind, task_id=task_id, state=UpstreamState.NOT_FOUND, error=str(exc)
            )
        body = self._poll_get(kind, self._request_path(app, request_id, "/status"), task_id)
        if isinstance(body, UpstreamStatus):
            return body
        if isinstance(body, dict) and body.get("status") == COMPLETED and fal_error(body) is None:
            result = self._poll_get(kind, self._request_path(app, request_id), task_id)
            if isinstance(result, UpstreamStatus):
                # Completed, then gone: the result was deleted (fal's payload retention).
                return result.model_copy(update={"state": UpstreamState.EXPIRED})
            body = {**body, "response": result}
        if not isinstance(body, dict):
            raise ProviderProtocolError(kind, f"status answer must be an object, got {body!r:.120}")
        return parse_fal(Body(kind), str(self._kind(kind).family), body, task_id)

    def cancel_task(self, collection: str, task_id: str) -> CancelResult:
        """``PUT …/requests/{id}/cancel``: queued requests are removed, running ones signalled."""
        label = f"{NAME}-cancel"
        app, request_id = split_task_id(label, task_id)
        try:
            response = self.http.request(
                "PUT", self._request_path(app, request_id, "/cancel"), label=label, idempotent=True
            )
        except ProviderNotFound:
            return CancelResult.NOT_FOUND
        except ProviderHTTPError as exc:
            if exc.status_code == 400 and "ALREADY_COMPLETED" in str(exc):
                return CancelResult.ALREADY_ENDED
            raise
        answer = json_body(label, response)
        status = answer.get("status") if isinstance(answer, dict) else None
        if status == "CANCELLATION_REQUESTED":
            return CancelResult.CANCELLED
        if status == "ALREADY_COMPLETED":
            return CancelResult.ALREADY_ENDED
        if status == "NOT_FOUND":
            return CancelResult.NOT_FOUND
        raise ProviderProtocolError(label, f"cancel answer has an unknown status: {answer!r:.200}")
