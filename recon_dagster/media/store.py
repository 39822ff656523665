"""Where finished media lands: a ``MediaStore`` (local folder by default, S3/R2 when configured).

Keys are derived from the job id (``media_key``) so that a repeated upload -- worker and
reconciliation racing, a retried finalize -- overwrites the same object instead of adding one
(spec 5.4 step 3). Every ``put_stream`` is all-or-nothing: when the chunk iterator raises (cap
exceeded, network error) nothing is left at the key, and a previous object there is untouched.
"""

from __future__ import annotations

import hashlib
import mimetypes
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import Field, PrivateAttr

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


def media_key(
    job_id: object, job_type: str, index: int = 0, ext: str = "bin", variant: str | None = None
) -> str:
    """Deterministic key for output ``index`` of a job, e.g. ``images/{job_id}/0.watermarked.png``.

    The same arguments always give the same key, so a repeated upload overwrites one object.
    Raises ``ValueError`` for a job id, extension or variant that is not a safe key segment.
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
    return f"{media_folder(job_type)}/{job}/{name}.{extension}"


_EXT_OVERRIDES = {
    "image/jpeg": "jpg",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "video/quicktime": "mov",
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


# --- local folder -----------------------------------------------------------------------------


class LocalMediaStore(dg.ConfigurableResource):
    """Media in a local folder (the default; ``RECON_MEDIA_DIR``); writes are temp file + rename."""

    base_dir: str = Field(description="Folder that holds the media tree.")

    def _path(self, key: str) -> Path:
        return Path(self.base_dir).absolute() / validate_key(key)

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> StoredObject:
        """Write ``chunks`` to ``key``; a failing iterator leaves nothing behind (and any old object intact)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        # Same directory as the target, so os.replace is an atomic rename on one filesystem.
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp_name, path)
        except BaseException:
            with _suppress_oserror():
                os.unlink(tmp_name)
            raise
        return StoredObject(key=key, size=size, url=path.as_uri(), sha256=digest.hexdigest())

    def exists(self, key: str) -> bool:
        """True when an object is stored at ``key``."""
        return self._path(key).is_file()

    def read_bytes(self, key: str) -> bytes:
        """The whole object (meant for tests and small objects); ``FileNotFoundError`` if absent."""
        return self._path(key).read_bytes()

    def delete(self, key: str) -> None:
        """Remove the object at ``key``; absent is fine."""
        with _suppress_oserror(FileNotFoundError):
            self._path(key).unlink()


class _suppress_oserror:
    def __init__(self, kind: type[OSError] = OSError) -> None:
        self.kind = kind

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        return exc_type is not None and issubclass(exc_type, self.kind)


# --- S3 / R2 ----------------------------------------------------------------------------------


class S3MediaStore(dg.ConfigurableResource):
    """Media in an S3-compatible bucket (R2 via ``S3Resource(endpoint_url=...)``).

    Objects up to ``part_size`` go in one PutObject; larger ones stream as a multipart upload one
    part at a time (memory ~ part size), aborted if anything fails so no partial object appears.
    """

    s3: S3Resource
    bucket: str = Field(description="Bucket name.")
    prefix: str = Field(default="", description="Key prefix inside the bucket, e.g. 'media/'.")
    part_size: int = Field(default=DEFAULT_PART_SIZE, description="Multipart part size in bytes (>= 5 MiB).")
    public_base_url: str | None = Field(
        default=None, description="Public URL of the bucket root; when unset urls are s3://bucket/key."
    )

    _client: Any = PrivateAttr(default=None)
    _client_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __repr__(self) -> str:
        # The nested S3Resource holds resolved credentials once Dagster has processed the config.
        return f"S3MediaStore(bucket={self.bucket!r}, prefix={self.prefix!r}, part_size={self.part_size})"

    __str__ = __repr__

    def _get_client(self) -> Any:
        # boto3 clients are thread-safe once built, but building one is not: build once, lazily.
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    # process_config_and_initialize resolves EnvVar fields also outside a Dagster run.
                    self._client = _shared_s3_client(self.s3.process_config_and_initialize())
        return self._client

    def _full_key(self, key: str) -> str:
        validate_key(key)
        prefix = self.prefix.strip("/")
        return f"{prefix}/{key}" if prefix else key

    def _url(self, full_key: str) -> str:
        if self.public_base_url:
            return f"{self.public_base_url.rstrip('/')}/{full_key}"
        return f"s3://{self.bucket}/{full_key}"

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> StoredObject:
        """Upload ``chunks`` to ``key``: one PutObject if small, else a multipart upload aborted on error."""
        if self.part_size < S3_MIN_PART_SIZE:
            raise ValueError(f"part_size {self.part_size} is below the S3 minimum of {S3_MIN_PART_SIZE}")
        full_key = self._full_key(key)
        client = self._get_client()
        digest = hashlib.sha256()
        iterator = iter(chunks)
        buffer = bytearray()
        size = 0
        for chunk in iterator:
            buffer += chunk
            digest.update(chunk)
            size += len(chunk)
            if len(buffer) > self.part_size:
                break
        else:
            client.put_object(
                Bucket=self.bucket,
                Key=full_key,
                Body=bytes(buffer),
                ContentType=content_type,
                Metadata={"sha256": digest.hexdigest()},
            )
            return StoredObject(key, size, self._url(full_key), digest.hexdigest())
        return self._put_multipart(client, key, full_key, iterator, buffer, digest, size, content_type)

    def _put_multipart(
        self,
        client: Any,
        key: str,
        full_key: str,
        rest: Iterator[bytes],
        buffer: bytearray,
        digest: Any,
        size: int,
        content_type: str,
    ) -> StoredObject:
        # The final object's metadata cannot be known before the last byte, so the sha256 is
        # returned to the caller rather than stored on a multipart object.
        upload_id = client.create_multipart_upload(
            Bucket=self.bucket, Key=full_key, ContentType=content_type
        )["UploadId"]
        parts: list[dict[str, Any]] = []

        def send(body: bytes) -> None:
            number = len(parts) + 1
            answer = client.upload_part(
                Bucket=self.bucket, Key=full_key, UploadId=upload_id, PartNumber=number, Body=body
            )
            parts.append({"ETag": answer["ETag"], "PartNumber": number})

        try:
            while True:
                while len(buffer) >= self.part_size:
                    # One copy of a part, not three: slice through a view, then drop it.
                    with memoryview(buffer) as view:
                        body = bytes(view[: self.part_size])
                    del buffer[: self.part_size]
                    send(body)
                    del body
                chunk = next(rest, None)
                if chunk is None:
                    break
                buffer += chunk
                digest.update(chunk)
                size += len(chunk)
            if buffer:
                send(bytes(buffer))
                buffer.clear()
            client.complete_multipart_upload(
                Bucket=self.bucket, Key=full_key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            with _suppress_exception():
                client.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id)
            raise
        return StoredObject(key, size, self._url(full_key), digest.hexdigest())

    def exists(self, key: str) -> bool:
        """True when an object is stored at ``key``."""
        from botocore.exceptions import ClientError

        try:
            self._get_client().head_object(Bucket=self.bucket, Key=self._full_key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def read_bytes(self, key: str) -> bytes:
        """The whole object (meant for tests and small objects); ``FileNotFoundError`` if absent."""
        from botocore.exceptions import ClientError

        try:
            answer = self._get_client().get_object(Bucket=self.bucket, Key=self._full_key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise FileNotFoundError(f"no media object at {key!r}") from None
            raise
        return answer["Body"].read()

    def delete(self, key: str) -> None:
        """Remove the object at ``key``; absent is fine."""
        self._get_client().delete_object(Bucket=self.bucket, Key=self._full_key(key))


_CLIENTS: dict[tuple[Any, ...], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _shared_s3_client(s3: S3Resource) -> Any:
    """One client per distinct configuration per process.

    Building a boto3 client costs ~0.1 s and Dagster builds resources anew for every run, so
    clients are shared; they are thread-safe. The cache key holds resolved settings in memory only.
    """
    key = tuple(getattr(s3, name) for name in sorted(S3Resource.model_fields))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = _build_s3_client(s3)
        return client


def _build_s3_client(s3: S3Resource) -> Any:
    """A boto3 S3 client from the resource's settings, with checksums only where S3 requires them.

    boto3 >= 1.36 adds CRC checksums (as aws-chunked trailers) to every upload by default, which
    S3-compatible stores such as R2 have rejected; ``S3Resource.get_client`` offers no way to
    pass a botocore ``Config``, hence this builder. Integrity is still reported as our SHA-256.
    """
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    config = Config(
        retries={"max_attempts": s3.max_attempts, "mode": "standard"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        signature_version=UNSIGNED if s3.use_unsigned_session else None,
    )
    session = boto3.session.Session(profile_name=s3.profile_name)
    return session.client(
        "s3",
        region_name=s3.region_name,
        endpoint_url=s3.endpoint_url,
        use_ssl=s3.use_ssl,
        verify=s3.verify,
        aws_access_key_id=s3.aws_access_key_id,
        aws_secret_access_key=s3.aws_secret_access_key,
        aws_session_token=s3.aws_session_token,
        config=config,
    )


class _suppress_exception:
    # Aborting is best effort: the original failure is the one worth raising.
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        return exc_type is not None and issubclass(exc_type, Exception)


# --- configuration ----------------------------------------------------------------------------


def media_store_from_env() -> LocalMediaStore | S3MediaStore:
    """``S3MediaStore`` when ``RECON_S3_BUCKET`` is set, else ``LocalMediaStore(RECON_MEDIA_DIR)``.

    Credentials and endpoint are passed as ``dg.EnvVar`` so their values never enter run config.
    Optional: ``RECON_S3_PREFIX``, ``RECON_S3_PUBLIC_BASE_URL``.
    """
    env = os.environ
    bucket = env.get("RECON_S3_BUCKET")
    if not bucket:
        return LocalMediaStore(
            base_dir=env.get("RECON_MEDIA_DIR") or os.path.join(os.getcwd(), DEFAULT_MEDIA_DIR)
        )
    s3_fields: dict[str, Any] = {}
    for field, var in (
        ("endpoint_url", "RECON_S3_ENDPOINT_URL"),
        ("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
        ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
        ("region_name", "AWS_REGION"),
    ):
        # Unset variables stay unset so boto3's own credential chain (roles, profiles) applies.
        if env.get(var):
            s3_fields[field] = dg.EnvVar(var)
    return S3MediaStore(
        s3=S3Resource(**s3_fields),
        bucket=bucket,
        prefix=env.get("RECON_S3_PREFIX", ""),
        public_base_url=env.get("RECON_S3_PUBLIC_BASE_URL") or None,
    )
