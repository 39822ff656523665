"""Download-to-store glue: the one call ``finalize_job_with_media`` needs per media URL."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import httpx

from recon_dagster.media.base import MediaStore, StoredObject
from recon_dagster.media.download import MediaStream, open_media_stream

DEFAULT_CONTENT_TYPE = "application/octet-stream"


def fetch_to_store(
    url: str,
    store: MediaStore,
    key: str | Callable[[MediaStream], str],
    *,
    max_bytes: int,
    content_type: str | None = None,
    allowed_hosts: Collection[str] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 30,
    client: httpx.Client | None = None,
    deadline_s: float | None = None,
    min_bytes_per_s: float | None = None,
) -> StoredObject:
    """Stream ``url`` into ``store`` at ``key`` (or ``key(stream)``, to pick the extension from the
    response's content type); all-or-nothing, memory bounded by one chunk or S3 part.

    Raises the ``MediaError`` of ``open_media_stream``; on any failure nothing is stored.
    """
    with open_media_stream(
        url,
        max_bytes=max_bytes,
        allowed_hosts=allowed_hosts,
        headers=headers,
        timeout_s=timeout_s,
        client=client,
        deadline_s=deadline_s,
        min_bytes_per_s=min_bytes_per_s,
    ) as stream:
        target = key(stream) if callable(key) else key
        media_type = content_type or stream.content_type or DEFAULT_CONTENT_TYPE
        return store.put_stream(target, stream.iter_chunks(), media_type)


def fetch_bytes(
    url: str,
    *,
    max_bytes: int,
    allowed_hosts: Collection[str] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 30,
    client: httpx.Client | None = None,
    deadline_s: float | None = None,
    min_bytes_per_s: float | None = None,
) -> tuple[bytes, str | None]:
    """Fetch a small object (an image to watermark) into memory under the same policy and cap."""
    with open_media_stream(
        url,
        max_bytes=max_bytes,
        allowed_hosts=allowed_hosts,
        headers=headers,
        timeout_s=timeout_s,
        client=client,
        deadline_s=deadline_s,
        min_bytes_per_s=min_bytes_per_s,
    ) as stream:
        return b"".join(stream.iter_chunks()), stream.content_type
