"""fal's queue answers: a request's status (``IN_QUEUE``, ``IN_PROGRESS``, ``COMPLETED``) and, once
completed without an error, its result (the model's output, its files on fal's CDN).

The client merges the two answers into one body for the parser: the status answer, with the result
answer under ``response`` when it fetched one (fal's webhooks carry it the same way, as ``payload``).
"""

from __future__ import annotations

from typing import Any

from recon_dagster.providers.parse import (
    FAILED,
    RUNNING,
    SUCCEEDED,
    Body,
    is_int,
    looks_like_url,
    media_kind_of,
    show,
    status_of,
    text_of,
)
from recon_dagster.providers.status import MediaRef, UpstreamStatus

QUEUED, IN_PROGRESS, COMPLETED = "IN_QUEUE", "IN_PROGRESS", "COMPLETED"

# Output fields that hold files, as fal's models name them; any other top-level file object counts too.
_KNOWN_FILE_FIELDS = ("images", "image", "video", "videos", "audio", "audio_file", "file", "files")


def fal_error(body: dict[str, Any]) -> str | None:
    """A completed request's error: ``error_type: error`` (either may be missing)."""
    error, kind = text_of(body.get("error")), text_of(body.get("error_type"))
    if error and kind:
        return f"{kind}: {error}"
    return error or kind


def _file(value: object) -> MediaRef | None:
    """A fal File object (``{url, content_type, file_name, file_size}``), or None."""
    if not isinstance(value, dict) or not looks_like_url(value.get("url")):
        return None
    url = str(value["url"])
    ctype = value.get("content_type")
    kind = ctype.split("/", 1)[0] if isinstance(ctype, str) and "/" in ctype else media_kind_of(url)
    return MediaRef(url=url, kind=kind if kind in ("image", "video", "audio") else media_kind_of(url))


def output_media(b: Body, output: dict[str, Any]) -> tuple[MediaRef, ...]:
    """Every file of a result, the known fields first (``images``, ``video``...), in their order."""
    fields = [k for k in _KNOWN_FILE_FIELDS if k in output] + [
        k for k in output if k not in _KNOWN_FILE_FIELDS
    ]
    media: list[MediaRef] = []
    for key in fields:
        value = output[key]
        items = value if isinstance(value, list) else [value]
        found = [_file(item) for item in items]
        if key in _KNOWN_FILE_FIELDS and isinstance(value, dict | list) and None in found and value:
            raise b.fail(f"response.{key} must hold file objects with an http(s) url, got {show(value)}")
        media.extend(ref for ref in found if ref is not None)
    return tuple(media)


def parse_fal(b: Body, family: str, body: dict[str, Any], task_id: str | None) -> UpstreamStatus:
    """One status answer (with the result under ``response`` when completed and fetched)."""
    status = body.get("status")
    if status == QUEUED:
        position = body.get("queue_position")
        if position is not None and not is_int(position):
            raise b.fail(f"queue_position must be an integer, got {show(position)}")
        stage = "in queue at fal" + (f", position {position}" if position is not None else "")
        return status_of(b.kind, body, RUNNING, task_id, stage=stage)
    if status == IN_PROGRESS:
        return status_of(b.kind, body, RUNNING, task_id, stage="in progress at fal")
    if status != COMPLETED:
        raise b.unknown_state("status", status)
    error = fal_error(body)
    if error is not None:
        return status_of(b.kind, body, FAILED, task_id, error=error)
    output = body.get("response")
    if not isinstance(output, dict):
        raise b.fail(f"COMPLETED without a result object under response, got {show(output)}")
    media = output_media(b, output)
    if not media:
        raise b.fail(f"completed with no file in its result: {show(output)}")
    return status_of(b.kind, body, SUCCEEDED, task_id, media=media, progress=100)
