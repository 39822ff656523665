"""Media objects the sandbox serves: a real PNG, or deterministic bytes generated chunk by chunk."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from functools import cache

CHUNK_SIZE = 64 * 1024

# media kind -> (file extension, content type)
MEDIA_TYPES: dict[str, tuple[str, str]] = {
    "image": ("png", "image/png"),
    "video": ("mp4", "video/mp4"),
    "audio": ("mp3", "audio/mpeg"),
    "weights": ("tar", "application/x-tar"),
    "text": ("txt", "text/plain; charset=utf-8"),
}

# Leading bytes that make content sniffers see the right type.
_MAGIC: dict[str, bytes] = {
    "video": b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom",
    "audio": b"ID3\x04\x00\x00\x00\x00\x00\x00",
    "weights": b"sandbox-weights\x00",
    "text": b"",
}


@cache
def png_bytes() -> bytes:
    """A real, small PNG (made once with Pillow)."""
    from PIL import Image

    img = Image.new("RGB", (64, 64))
    img.putdata([(x * 4, y * 4, 128) for y in range(64) for x in range(64)])
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@cache
def _block() -> bytes:
    # One fixed pseudo-random block, repeated: cheap to serve at any size, never all in memory.
    return hashlib.shake_256(b"recon-dagster-sandbox-media").digest(CHUNK_SIZE)


def media_length(kind: str, size: int) -> int:
    """How many bytes ``iter_media`` yields for this kind and requested size."""
    return len(png_bytes()) if kind == "image" else size


def iter_media(task_id: str, n: int, kind: str, size: int) -> Iterator[bytes]:
    """The bytes of media object ``n`` of a task, in chunks of at most ``CHUNK_SIZE``.

    Deterministic: the same arguments always give the same bytes (see ``media_digest``).
    """
    if kind == "image":
        yield png_bytes()
        return
    head = _MAGIC.get(kind, b"") + f"{task_id}/{n}\n".encode()
    block = _block()
    first = (head + block)[:CHUNK_SIZE]
    remaining = size
    if remaining <= 0:
        return
    chunk = first[:remaining]
    yield chunk
    remaining -= len(chunk)
    while remaining > 0:
        chunk = block[: min(CHUNK_SIZE, remaining)]
        yield chunk
        remaining -= len(chunk)


def media_digest(task_id: str, n: int, kind: str, size: int) -> str:
    """SHA-256 hex of what the sandbox serves for this media object (computed by streaming)."""
    h = hashlib.sha256()
    for chunk in iter_media(task_id, n, kind, size):
        h.update(chunk)
    return h.hexdigest()
