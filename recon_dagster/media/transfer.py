"""Download-to-store glue: the one call ``finalize_job_with_media`` needs per media URL.

Every fetch refuses what cannot be the promised media (``media.content``: empty, an error page,
an encoded body) with ``MediaUnusable`` before anything is stored.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING

import httpx

from recon_dagster.media.base import MediaStore, StoredObject
from recon_dagster.media.content import check_headers, checked_chunks, declared_kind
from recon_dagster.media.download import MediaStream, open_media_stream
from recon_dagster.media.errors import MediaTooLarge, MediaUnusable

if TYPE_CHECKING:
    from recon_dagster.media.video_limits import VideoBudget

DEFAULT_CONTENT_TYPE = "application/octet-stream"
_FILE_CHUNK = 1024 * 1024

# (content type, variant or None) -> the key to store under.
KeyFor = Callable[[str, str | None], str]


def checked_body(stream: MediaStream, promised: str | None) -> Iterator[bytes]:
    """The body of ``stream``, refused (``MediaUnusable``) when it cannot be ``promised`` media."""
    problem = check_headers(stream.content_type, stream.content_encoding, stream.content_length, promised)
    if problem is not None:
        raise MediaUnusable(stream.url, problem)
    return checked_chunks(
        stream.iter_chunks(), promised, stream.url, stream.content_type, stream.content_length
    )


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
    promised: str | None = None,
) -> StoredObject:
    """Stream ``url`` into ``store`` at ``key`` (or ``key(stream)``, to pick the extension from the
    response's content type); all-or-nothing, memory bounded by one chunk or S3 part.

    Raises the ``MediaError`` of ``open_media_stream``, or ``MediaUnusable`` when the body cannot
    be the ``promised`` media kind; on any failure nothing is stored.
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
        body = checked_body(stream, promised)
        target = key(stream) if callable(key) else key
        media_type = content_type or stream.content_type or DEFAULT_CONTENT_TYPE
        return store.put_stream(target, body, media_type)


def fetch_media_to_store(
    url: str,
    store: MediaStore,
    key: KeyFor,
    *,
    promised: str | None,
    watermark_text: str | None,
    max_bytes: int,
    max_image_bytes: int,
    allowed_hosts: Collection[str] | None = None,
    headers: Mapping[str, str] | None = None,
    client: httpx.Client | None = None,
    deadline_s: float | None = None,
    min_bytes_per_s: float | None = None,
    video_budget: VideoBudget | None = None,
) -> StoredObject:
    """Fetch one result object and store it, watermarked when ``watermark_text`` is given and the
    object is an image or a video (its Content-Type says so, else ``promised`` does); audio and
    everything else is streamed as it came. Only the watermarked variant is ever stored.

    An image is buffered (capped at ``max_image_bytes``) to be decoded; a video is spooled to a
    temporary file and re-encoded file to file, so memory stays bounded whatever its size (the
    temporary directory needs room for the video twice), within ``video_budget`` (the job's
    ``RECON_VIDEO_*`` bounds). Raises like ``fetch_to_store``, and ``MediaNotImage`` /
    ``MediaNotVideo`` when the object cannot be watermarked (or passes the video budget).
    """
    with open_media_stream(
        url,
        max_bytes=max_bytes,
        allowed_hosts=allowed_hosts,
        headers=headers,
        client=client,
        deadline_s=deadline_s,
        min_bytes_per_s=min_bytes_per_s,
    ) as stream:
        body = checked_body(stream, promised)
        kind = (declared_kind(stream.content_type) or promised) if watermark_text is not None else None
        if kind == "image":
            return _store_watermarked_image(stream, body, store, key, watermark_text or "", max_image_bytes)
        if kind == "video":
            return _store_watermarked_video(body, store, key, watermark_text or "", video_budget)
        media_type = stream.content_type or DEFAULT_CONTENT_TYPE
        return store.put_stream(key(media_type, None), body, media_type)


def _store_watermarked_image(
    stream: MediaStream, body: Iterator[bytes], store: MediaStore, key: KeyFor, text: str, cap: int
) -> StoredObject:
    from recon_dagster.media.watermark import watermark_image

    if stream.content_length is not None and stream.content_length > cap:
        raise MediaTooLarge(stream.url, cap, stream.content_length, declared=True)
    data = bytearray()
    for chunk in body:
        data += chunk
        if len(data) > cap:
            raise MediaTooLarge(stream.url, cap, len(data))
    marked, content_type = watermark_image(bytes(data), text)
    return store.put_stream(key(content_type, "watermarked"), iter([marked]), content_type)


def _store_watermarked_video(
    body: Iterator[bytes], store: MediaStore, key: KeyFor, text: str, budget: VideoBudget | None
) -> StoredObject:
    from recon_dagster.media.watermark import watermark_video

    with tempfile.TemporaryDirectory(prefix="recon-watermark-") as tmp:
        source, marked = os.path.join(tmp, "source"), os.path.join(tmp, "marked")
        with open(source, "wb") as spool:
            for chunk in body:
                spool.write(chunk)
        content_type = watermark_video(source, marked, text, budget)
        return store.put_stream(key(content_type, "watermarked"), _file_chunks(marked), content_type)


def _file_chunks(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(_FILE_CHUNK):
            yield chunk


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
    promised: str | None = None,
) -> tuple[bytes, str | None]:
    """Fetch a small object into memory under the same policy, cap and content checks."""
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
        return b"".join(checked_body(stream, promised)), stream.content_type
