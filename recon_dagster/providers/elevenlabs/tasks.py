"""ElevenLabs' part of the orphan sweep: list dubbings, stop one, mark a create.

``GET /v1/dubbing`` lists the account's dubs, newest first when asked (``order_by=created_at``,
``order_direction=DESCENDING``), ``page_size`` up to 200, the next page through ``cursor`` (the
answer's ``next_cursor`` while ``has_more``). It has no time filter: the walk stops at the first
dub older than the window. ElevenLabs has no cancel: ``DELETE /v1/dubbing/{id}`` deletes the dub,
which stops a running one. Every page and delete goes through the resource's own client. A create
carries the job marker in the dub's ``name``, which the list shows back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from recon_dagster.db.ledger import parse_marker
from recon_dagster.providers.http import ProviderNotFound, json_body
from recon_dagster.providers.status import ProviderProtocolError
from recon_dagster.providers.task_pages import check_page, parse_time
from recon_dagster.providers.upstream_tasks import CancelResult, TaskPhase, UpstreamTask

if TYPE_CHECKING:
    from recon_dagster.providers.http import ProviderHttp

COLLECTION = "dubbing"
# The provider kind of a dubbing job.
DUBBING_KIND = "elevenlabs-async"
PAGE_SIZE = 200  # ElevenLabs' most per page
PHASES = {"dubbed": TaskPhase.SUCCEEDED, "failed": TaskPhase.ENDED, "deleted": TaskPhase.ENDED}
LABEL = "elevenlabs"
MARKER_PREFIX = "recon "


def listed_dub(item: dict[str, Any]) -> UpstreamTask | None:
    task_id = item.get("dubbing_id")
    if not isinstance(task_id, str) or not task_id:
        return None
    status = str(item.get("status") or "")
    name = item.get("name") if isinstance(item.get("name"), str) else ""
    found = parse_marker(name)
    return UpstreamTask(
        provider=LABEL,
        task_id=task_id,
        collection=COLLECTION,
        kind=DUBBING_KIND,
        phase=PHASES.get(status, TaskPhase.RUNNING),  # "dubbing", or a word we do not know
        status=status,
        created_at=parse_time(item.get("created_at")),
        marker=None if found is None else f"{found[0]}.{found[1]}",
    )


class ElevenLabsTasks:
    """Mixed into ``ElevenLabsResource``: ``TaskListing``, ``TaskCancelling`` (by deleting the
    dub) and the create's marker."""

    if TYPE_CHECKING:
        http: ProviderHttp

    def mark_request(self, kind: str, payload: dict[str, Any], marker: str) -> dict[str, Any] | None:
        if not isinstance(payload, dict):
            return None
        name = payload.get("name")
        named = (
            f"{name} [{MARKER_PREFIX}{marker}]"
            if isinstance(name, str) and name
            else f"{MARKER_PREFIX}{marker}"
        )
        return {**payload, "name": named}

    def task_collections(self) -> Mapping[str, frozenset[str]]:
        return {COLLECTION: frozenset({DUBBING_KIND})}

    def list_collection(
        self, collection: str, *, created_after: datetime, created_before: datetime | None = None
    ) -> Iterator[UpstreamTask]:
        if collection != COLLECTION:
            raise ValueError(f"elevenlabs has no task collection {collection!r}")
        return self.list_tasks(created_after=created_after, created_before=created_before)

    def list_tasks(
        self, *, created_after: datetime, created_before: datetime | None = None
    ) -> Iterator[UpstreamTask]:
        params = {"page_size": str(PAGE_SIZE), "order_by": "created_at", "order_direction": "DESCENDING"}
        seen: set[str] = set()
        while True:
            check_page(LABEL, params.get("cursor", ""), seen)
            response = self.http.request("GET", "/v1/dubbing", label=LABEL, idempotent=True, params=params)
            body = json_body(LABEL, response)
            if not isinstance(body, dict) or not isinstance(body.get("dubs"), list):
                raise ProviderProtocolError(LABEL, f"list answer has no dubs: {body!r:.200}")
            for item in body["dubs"]:
                task = listed_dub(item) if isinstance(item, dict) else None
                if task is None:
                    continue
                if task.created_at is not None and task.created_at < created_after:
                    return  # newest first: the rest are older still
                if created_before is None or task.created_at is None or task.created_at < created_before:
                    yield task
            cursor = body.get("next_cursor")
            if not body.get("has_more") or not isinstance(cursor, str) or not cursor:
                return
            params = {**params, "cursor": cursor}

    def cancel_task(self, collection: str, task_id: str) -> CancelResult:
        if collection != COLLECTION:
            raise ValueError(f"elevenlabs has no task collection {collection!r}")
        try:
            self.http.request(
                "DELETE", f"/v1/dubbing/{quote(task_id, safe='')}", label=LABEL, idempotent=True
            )
        except ProviderNotFound:
            return CancelResult.NOT_FOUND
        return CancelResult.CANCELLED
