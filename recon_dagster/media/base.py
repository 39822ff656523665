"""What every media store shares, free of Dagster: keys, ``StoredObject`` and the ``MediaStore``
protocol.

Keys are derived from the job id and the upstream task (``media_key``) so that a repeated upload of
the same result -- worker and reconciliation racing, a retried finalize -- overwrites the same
object instead of adding one (spec 5.4 step 3), while a finalize of another task's result (an
orphan duplicate, a stray webhook) can never overwrite an object the winner references. Every ``put_stream`` is all-or-nothing: when the chunk iterator raises (cap
exceeded, network error) nothing is left at the key, and a previous object there is untouched.

The writers (``folder.FolderWriter``, ``s3.S3Writer``) and this module import no Dagster, so a
process that only moves bytes does not pay for it; ``store`` and ``s3_store`` wrap them as Dagster
resources through ``DelegatesToWriter``, kept here so that ``s3_store`` need not import ``store``
(which imports ``s3_store`` on first use).
"""

from __future__ import annotations

import hashlib
import mimetypes
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

MIB = 1024 * 1024
# S3 refuses parts below 5 MiB (except the last); R2 follows the same rule.
S3_MIN_PART_SIZE = 5 * MIB
DEFAULT_PART_SIZE = 8 * MIB
DEFAULT_MEDIA_DIR = os.path.join(".recon", "media")

# --- keys (pure) ------------------------------------------------------------------------------

# Media kinds (MediaRef.kind) and job types map to the top-level folder of a key.
_FOLDERS = {
    "image": "images",
    "images": "images",
    "video": "videos",
    "videos": "videos",
    "audio": "audio",
    "weights": "loras",
    "lora": "loras",
    "loras": "loras",
    "file": "files",
}
# Checked in order against a free-text job_type such as "image-ai" or "suno-voice-create".
_FOLDER_HINTS = (
    ("lora", "loras"),
    ("training", "loras"),
    ("lip-sync", "videos"),
    ("video", "videos"),
    ("image", "images"),
    ("audio", "audio"),
    ("suno", "audio"),
    ("tts", "audio"),
    ("dubbing", "audio"),
    ("voice", "audio"),
    ("music", "audio"),
)
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_EXT = re.compile(r"^[a-z0-9]{1,16}$")
_VARIANT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
_KEY_PART = re.compile(r"^[A-Za-z0-9._-]+$")


def media_folder(job_type: str) -> str:
    """Top-level folder for a job type or media kind (``images``, ``videos``, ``audio``, ``loras``, ``files``)."""
    name = job_type.strip().lower()
    if name in _FOLDERS:
        return _FOLDERS[name]
    for hint, folder in _FOLDER_HINTS:
        if hint in name:
            return folder
    return "files"


def task_segment(task_id: str) -> str:
    """The key folder of one upstream task: 16 hex digits of its SHA-256 (any task id is safe)."""
    return hashlib.sha256(task_id.encode()).hexdigest()[:16]


def media_key(
    job_id: object,
    job_type: str,
    index: int = 0,
    ext: str = "bin",
    variant: str | None = None,
    *,
    task: str | None = None,
) -> str:
    """Deterministic key for output ``index`` of a job's result from upstream ``task``, e.g.
    ``images/{job_id}/{task_segment(task)}/0.watermarked.png`` (no task, as for a sync call:
    ``images/{job_id}/0.png``).

    The same arguments always give the same key, so a repeated upload overwrites one object; two
    tasks of one job never share a key. Raises ``ValueError`` for a job id, extension or variant
    that is not a safe key segment, or an empty task id.
    """
    job = str(job_id)
    if not _SEGMENT.match(job) or ".." in job:
        raise ValueError(f"job_id {job!r} is not a safe key segment (letters, digits, . _ -)")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"index must be a non-negative int, got {index!r}")
    extension = ext.lower().lstrip(".")
    if not _EXT.match(extension):
        raise ValueError(f"extension {ext!r} must be 1-16 letters or digits")
    name = str(index)
    if variant is not None:
        if not _VARIANT.match(variant):
            raise ValueError(f"variant {variant!r} must be lowercase letters, digits, _ or -")
        name = f"{name}.{variant}"
    if task is None:
        return f"{media_folder(job_type)}/{job}/{name}.{extension}"
    if not isinstance(task, str) or not task:
        raise ValueError(f"task must be a non-empty string, got {task!r}")
    return f"{media_folder(job_type)}/{job}/{task_segment(task)}/{name}.{extension}"


_EXT_OVERRIDES = {
    "image/jpeg": "jpg",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "video/quicktime": "mov",
    "video/x-matroska": "mkv",
    "application/x-tar": "tar",
    "application/zip": "zip",
}


def guess_ext(content_type: str | None, url: str | None = None, default: str = "bin") -> str:
    """File extension for a download: from its media type, else from the URL path, else ``default``."""
    if content_type:
        media_type = content_type.split(";", 1)[0].strip().lower()
        ext = _EXT_OVERRIDES.get(media_type) or (mimetypes.guess_extension(media_type) or "").lstrip(".")
        if ext and _EXT.match(ext) and media_type != "application/octet-stream":
            return ext
    if url:
        path = url.split("?", 1)[0].split("#", 1)[0]
        tail = path.rsplit("/", 1)[-1]
        if "." in tail:
            ext = tail.rsplit(".", 1)[-1].lower()
            if _EXT.match(ext):
                return ext
    return default


def validate_key(key: str) -> str:
    """Return ``key`` if it is a relative ``/``-separated path of safe segments, else ``ValueError``."""
    if not key or key.startswith("/") or len(key) > 1024:
        raise ValueError(f"media key {key!r} must be a non-empty relative path")
    for part in key.split("/"):
        if part in ("", ".", "..") or not _KEY_PART.match(part):
            raise ValueError(f"media key {key!r} has an unsafe segment {part!r}")
    return key


# --- the store protocol -----------------------------------------------------------------------


@dataclass(frozen=True)
class StoredObject:
    """What ``put_stream`` wrote: its key, size in bytes, URL and SHA-256 (hex)."""

    key: str
    size: int
    url: str
    sha256: str


@runtime_checkable
class MediaStore(Protocol):
    """Object storage for finished media; ``put_stream`` is all-or-nothing and thread-safe."""

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> StoredObject: ...

    def exists(self, key: str) -> bool: ...

    def read_bytes(self, key: str) -> bytes: ...

    def delete(self, key: str) -> None: ...


class DelegatesToWriter:
    """The ``MediaStore`` protocol for a resource whose ``writer()`` does the work."""

    def writer(self) -> MediaStore:
        raise NotImplementedError

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> StoredObject:
        """Write ``chunks`` to ``key``, all-or-nothing (folder: temp file + rename; S3: single
        PutObject when small, else a multipart upload aborted on error)."""
        return self.writer().put_stream(key, chunks, content_type)

    def exists(self, key: str) -> bool:
        """True when an object is stored at ``key``."""
        return self.writer().exists(key)

    def read_bytes(self, key: str) -> bytes:
        """The whole object (meant for tests and small objects); ``FileNotFoundError`` if absent."""
        return self.writer().read_bytes(key)

    def delete(self, key: str) -> None:
        """Remove the object at ``key``; absent is fine."""
        self.writer().delete(key)
