"""Replicate's part of the orphan sweep: list predictions and trainings, cancel one, mark a create.

``GET /v1/predictions`` and ``GET /v1/trainings`` list the account's tasks newest first, a page
at a time (``{"results": [...], "next": <url or null>}``), narrowed by ``created_after`` /
``created_before``; ``POST /v1/{collection}/{id}/cancel`` stops one. Every page and cancel goes
through the resource's own client (``self.http``): the read limit, the poll deadline, the size cap
and the redaction of polls. A create carries the job marker as a query parameter of its
``webhook`` URL, and a ``Cancel-After`` deadline so a task nobody collects stops by itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from recon_dagster.config import settings
from recon_dagster.core.kinds import RECONCILE_CADENCE, get_kind
from recon_dagster.db.ledger import fingerprint
from recon_dagster.providers.create_marker import mark_url_field, marker_param
from recon_dagster.providers.http import ProviderNotFound, json_body
from recon_dagster.providers.status import ProviderProtocolError
from recon_dagster.providers.task_pages import check_page, iso, parse_time
from recon_dagster.providers.upstream_tasks import CancelResult, TaskPhase, UpstreamTask

if TYPE_CHECKING:
    from recon_dagster.providers.http import ProviderHttp

COLLECTIONS = ("predictions", "trainings")
# The provider kind a job of each collection has.
KIND_OF_COLLECTION = {"predictions": "replicate-prediction", "trainings": "replicate-training"}
PHASES = {
    "starting": TaskPhase.RUNNING,
    "processing": TaskPhase.RUNNING,
    "succeeded": TaskPhase.SUCCEEDED,
    "failed": TaskPhase.ENDED,
    "canceled": TaskPhase.ENDED,
    "aborted": TaskPhase.ENDED,
}
# Replicate refuses a Cancel-After shorter than this.
MIN_CANCEL_AFTER_S = 5
LABEL = "replicate"


def default_cancel_after(kind: str) -> timedelta:
    """When the reconciler gives up on a job of ``kind`` anyway: its stale threshold plus every
    attempt at the cadence. Past it nobody will collect the task's result."""
    now = settings()
    cadence = timedelta(seconds=now.reconcile_cadence_s) if now.reconcile_cadence_s else RECONCILE_CADENCE
    return get_kind(kind).stale_threshold + now.max_attempts * cadence


def cancel_after_header(kind: str) -> dict[str, str]:
    """The ``Cancel-After`` header of a create of ``kind`` (none when set to 0)."""
    configured = settings().replicate_cancel_after_s
    seconds = default_cancel_after(kind).total_seconds() if configured is None else configured
    if seconds <= 0:
        return {}
    return {"Cancel-After": f"{max(MIN_CANCEL_AFTER_S, int(seconds))}s"}


def listed_task(collection: str, item: dict[str, Any]) -> UpstreamTask | None:
    """One listed prediction or training; None for an item without an id."""
    task_id = item.get("id")
    if not isinstance(task_id, str) or not task_id:
        return None
    status = str(item.get("status") or "")
    metrics = item.get("metrics") if isinstance(item.get("metrics"), dict) else {}
    raw_input = item.get("input")
    return UpstreamTask(
        provider=LABEL,
        task_id=task_id,
        collection=collection,
        kind=KIND_OF_COLLECTION.get(collection),
        phase=PHASES.get(status, TaskPhase.RUNNING),  # an unknown word may still bill
        status=status,
        created_at=parse_time(item.get("created_at")),
        completed_at=parse_time(item.get("completed_at")),
        marker=marker_param(item.get("webhook")),
        model=item.get("model") if isinstance(item.get("model"), str) else None,
        metrics={k: float(v) for k, v in (metrics or {}).items() if isinstance(v, int | float)},
        fingerprint=fingerprint({"input": raw_input}) if isinstance(raw_input, dict) else None,
    )


class ReplicateTasks:
    """Mixed into ``ReplicateResource``: ``TaskListing``, ``TaskCancelling``, the create's marker
    and its ``Cancel-After``."""

    if TYPE_CHECKING:
        http: ProviderHttp

        def resolved_base_url(self) -> str: ...

    def mark_request(self, kind: str, payload: dict[str, Any], marker: str) -> dict[str, Any] | None:
        return mark_url_field(payload, "webhook", marker) if isinstance(payload, dict) else None

    def create_headers(self, kind: str) -> dict[str, str]:
        return cancel_after_header(kind)

    def task_collections(self) -> Mapping[str, frozenset[str]]:
        return {c: frozenset({KIND_OF_COLLECTION[c]}) for c in COLLECTIONS}

    def list_collection(
        self, collection: str, *, created_after: datetime, created_before: datetime | None = None
    ) -> Iterator[UpstreamTask]:
        if collection not in COLLECTIONS:
            raise ValueError(f"replicate has no task collection {collection!r}")
        return self._list_collection(collection, created_after, created_before)

    def list_tasks(
        self, *, created_after: datetime, created_before: datetime | None = None
    ) -> Iterator[UpstreamTask]:
        for collection in COLLECTIONS:
            yield from self._list_collection(collection, created_after, created_before)

    def _next_page(self, url: object) -> str | None:
        """The ``next`` cursor URL, checked to be on this API (the key goes nowhere else)."""
        if not url:
            return None
        base = httpx.URL(self.resolved_base_url())
        target = httpx.URL(str(url))
        if (target.scheme, target.host, target.port) != (base.scheme, base.host, base.port):
            raise ProviderProtocolError(LABEL, f"list cursor leaves the API host: {str(url)[:120]!r}")
        return str(target)

    def _list_collection(
        self, collection: str, after: datetime, before: datetime | None
    ) -> Iterator[UpstreamTask]:
        params: dict[str, str] | None = {
            "created_after": iso(after),
            **({"created_before": iso(before)} if before else {}),
        }
        page: str | None = f"/{collection}"
        seen: set[str] = set()
        while page is not None:
            check_page(LABEL, page, seen)
            response = self.http.request("GET", page, label=LABEL, idempotent=True, params=params)
            body = json_body(LABEL, response)
            if not isinstance(body, dict) or not isinstance(body.get("results"), list):
                raise ProviderProtocolError(LABEL, f"list answer has no results: {body!r:.200}")
            older = False
            for item in body["results"]:
                task = listed_task(collection, item) if isinstance(item, dict) else None
                if task is None:
                    continue
                if task.created_at is not None and task.created_at < after:
                    older = True  # newest first: the rest are older still
                    break
                if before is None or task.created_at is None or task.created_at < before:
                    yield task
            page = None if older else self._next_page(body.get("next"))
            params = None  # the cursor URL carries the filters (an empty dict would drop them)

    def cancel_task(self, collection: str, task_id: str) -> CancelResult:
        if collection not in COLLECTIONS:
            raise ValueError(f"replicate has no task collection {collection!r}")
        path = f"/{collection}/{quote(task_id, safe='')}/cancel"
        try:
            response = self.http.request("POST", path, label=LABEL, idempotent=True)
        except ProviderNotFound:
            return CancelResult.NOT_FOUND
        body = json_body(LABEL, response)
        status = body.get("status") if isinstance(body, dict) else None
        if status in ("canceled", "starting", "processing"):
            return CancelResult.CANCELLED
        return CancelResult.ALREADY_ENDED
