"""Replicate: predictions and trainings (both async)."""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote

import httpx
from pydantic import Field

from recon_dagster.core.kinds import Family, Provider
from recon_dagster.providers.base import AsyncProviderResource
from recon_dagster.providers.http import json_body
from recon_dagster.providers.parse import parse_poll_response
from recon_dagster.providers.replicate_tasks import ReplicateTasks
from recon_dagster.providers.status import ProviderProtocolError, UpstreamStatus

REPLICATE_BASE_URL = "https://api.replicate.com/v1"


def _owner_name(kind: str, model: object) -> tuple[str, str]:
    if not isinstance(model, str) or model.count("/") != 1 or model.startswith("/") or model.endswith("/"):
        raise ValueError(f"{kind}: model must be 'owner/name', got {model!r}")
    owner, name = model.split("/")
    return quote(owner, safe=""), quote(name, safe="")


def replicate_error_message(response: httpx.Response) -> str | None:
    """Replicate errors are problem+json ``{title, detail, status}`` (429: ``{detail}``)."""
    try:
        body = response.json()
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    title, detail = body.get("title"), body.get("detail")
    parts = [str(p) for p in (title, detail) if p]
    return ": ".join(parts) or None


class ReplicateResource(ReplicateTasks, AsyncProviderResource):
    """Replicate client: ``replicate-prediction`` and ``replicate-training``."""

    PROVIDER: ClassVar[Provider] = Provider.REPLICATE

    base_url: str = Field(default=REPLICATE_BASE_URL, description="Replicate API base URL.")
    # Replicate: create 600/min, other calls 3000/min. A bucket admits at most burst + rate * 60 s
    # in any minute: 60 + 540 = 600 creates, 300 + 2700 = 3000 reads.
    create_rate_per_s: float | None = 9.0
    create_burst: int = 60
    read_rate_per_s: float | None = 45.0
    read_burst: int = 300

    def _error_message(self, response: httpx.Response) -> str | None:
        return replicate_error_message(response)

    def create(self, kind: str, payload: dict[str, Any]) -> str:
        """Start a prediction or a training; returns its ``id``.

        Predictions: ``{version, input, webhook?}`` to ``POST /predictions``, or ``{model:
        "owner/name", input}`` to the model's own predictions endpoint. Trainings: ``{model:
        "owner/name", version, destination, input, webhook?}`` to
        ``POST /models/{owner}/{name}/versions/{version}/trainings``.
        """
        family = self._kind(kind).family
        body: dict[str, Any] = dict(self._check_payload(kind, payload, ("input",)))
        if family is Family.REPLICATE_TRAINING:
            self._check_payload(kind, payload, ("model", "version", "destination"))
            owner, name = _owner_name(kind, body.pop("model"))
            version = quote(str(body.pop("version")), safe="")
            path = f"/models/{owner}/{name}/versions/{version}/trainings"
        elif "version" in body:
            path = "/predictions"
        elif "model" in body:
            owner, name = _owner_name(kind, body.pop("model"))
            path = f"/models/{owner}/{name}/predictions"
        else:
            raise ValueError(f"{kind}: payload needs a 'version' or a 'model'")
        response = self.http.request(
            "POST", path, label=kind, idempotent=False, json=body, headers=self.create_headers(kind)
        )
        answer = json_body(kind, response)
        task_id = answer.get("id") if isinstance(answer, dict) else None
        if not isinstance(task_id, str) or not task_id:
            raise ProviderProtocolError(kind, f"create answer has no id: {answer!r:.200}")
        return task_id

    def poll(self, kind: str, task_id: str) -> UpstreamStatus:
        """``GET /predictions/{id}`` or ``GET /trainings/{id}``, parsed."""
        family = self._kind(kind).family
        collection = "trainings" if family is Family.REPLICATE_TRAINING else "predictions"
        body = self._poll_get(kind, f"/{collection}/{quote(task_id, safe='')}", task_id)
        if isinstance(body, UpstreamStatus):
            return body
        return parse_poll_response(kind, body, task_id=task_id)
