"""``S3Writer``: a ``MediaStore`` in an S3-compatible bucket (S3, R2, moto), with no Dagster import.

Objects up to ``part_size`` go in one PutObject; larger ones stream as a multipart upload one part
at a time (memory ~ one part), aborted if anything fails so no partial object appears.
boto3 is imported only when a client is built, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from recon_dagster.media.base import DEFAULT_PART_SIZE, S3_MIN_PART_SIZE, StoredObject, validate_key

_MISSING_CODES = ("404", "NoSuchKey", "NotFound")


@dataclass(frozen=True)
class S3ClientSettings:
    """How to reach a bucket; the same fields as dagster-aws ``S3Resource`` (secrets kept out of repr)."""

    region_name: str | None = None
    endpoint_url: str | None = None
    max_attempts: int = 5
    profile_name: str | None = None
    use_ssl: bool = True
    verify: bool | None = None
    use_unsigned_session: bool = False
    aws_access_key_id: str | None = field(default=None, repr=False)
    aws_secret_access_key: str | None = field(default=None, repr=False)
    aws_session_token: str | None = field(default=None, repr=False)


def build_s3_client(settings: S3ClientSettings) -> Any:
    """A new boto3 S3 client, with request checksums only where S3 requires them.

    boto3 >= 1.36 adds CRC checksums (as aws-chunked trailers) to every upload by default, which
    S3-compatible stores such as R2 have rejected; ``S3Resource.get_client`` offers no way to
    pass a botocore ``Config``, hence this builder. Integrity is still reported as our SHA-256.
    """
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    config = Config(
        retries={"max_attempts": settings.max_attempts, "mode": "standard"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        signature_version=UNSIGNED if settings.use_unsigned_session else None,
    )
    session = boto3.session.Session(profile_name=settings.profile_name)
    return session.client(
        "s3",
        region_name=settings.region_name,
        endpoint_url=settings.endpoint_url,
        use_ssl=settings.use_ssl,
        verify=settings.verify,
        aws_access_key_id=settings.aws_access_key_id,
        aws_secret_access_key=settings.aws_secret_access_key,
        aws_session_token=settings.aws_session_token,
        config=config,
    )


_CLIENTS: dict[S3ClientSettings, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def shared_s3_client(settings: S3ClientSettings) -> Any:
    """One client per distinct ``settings`` per process.

    Building a boto3 client costs ~0.1 s and Dagster builds resources anew for every run, so
    clients are shared; they are thread-safe once built. The cache holds settings in memory only.
    """
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(settings)
        if client is None:
            client = _CLIENTS[settings] = build_s3_client(settings)
        return client


class S3Writer:
    """Media in ``bucket`` under ``prefix``; give either a boto3 ``client`` or a ``client_factory``.

    The factory is called once, on first use (so credentials resolve late); the writer is
    thread-safe. ``ValueError`` for a missing bucket, both/neither client sources, or a
    ``part_size`` below the S3 minimum of 5 MiB.
    """

    def __init__(
        self,
        bucket: str,
        *,
        client: Any = None,
        client_factory: Callable[[], Any] | None = None,
        prefix: str = "",
        part_size: int = DEFAULT_PART_SIZE,
        public_base_url: str | None = None,
    ) -> None:
        if not bucket:
            raise ValueError("S3Writer needs a bucket name")
        if (client is None) == (client_factory is None):
            raise ValueError("S3Writer needs exactly one of client= or client_factory=")
        if isinstance(part_size, bool) or not isinstance(part_size, int):
            raise ValueError(f"part_size must be an int number of bytes, got {part_size!r}")
        if part_size < S3_MIN_PART_SIZE:
            raise ValueError(f"part_size {part_size} is below the S3 minimum of {S3_MIN_PART_SIZE}")
        self.bucket = bucket
        self.prefix = prefix
        self.part_size = part_size
        self.public_base_url = public_base_url
        self._client = client
        self._client_factory = client_factory
        self._client_lock = threading.Lock()

    def __repr__(self) -> str:
        # Only names: a client or factory may hold resolved credentials.
        return f"S3Writer(bucket={self.bucket!r}, prefix={self.prefix!r}, part_size={self.part_size})"

    __str__ = __repr__

    @property
    def client(self) -> Any:
        """The boto3 client, built by the factory on first use."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    assert self._client_factory is not None
                    self._client = self._client_factory()
        return self._client

    def full_key(self, key: str) -> str:
        """The object key in the bucket: ``prefix`` + ``key``; ``ValueError`` for an unsafe key."""
        validate_key(key)
        prefix = self.prefix.strip("/")
        return f"{prefix}/{key}" if prefix else key

    def url(self, full_key: str) -> str:
        """Public URL of an object when ``public_base_url`` is set, else ``s3://bucket/key``."""
        if self.public_base_url:
            return f"{self.public_base_url.rstrip('/')}/{full_key}"
        return f"s3://{self.bucket}/{full_key}"

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> StoredObject:
        """Upload ``chunks`` to ``key``: one PutObject if small, else a multipart upload aborted on error."""
        full_key = self.full_key(key)
        client = self.client
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
            return StoredObject(key, size, self.url(full_key), digest.hexdigest())
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

        def send(body: bytes | bytearray) -> None:
            number = len(parts) + 1
            answer = client.upload_part(
                Bucket=self.bucket, Key=full_key, UploadId=upload_id, PartNumber=number, Body=body
            )
            parts.append({"ETag": answer["ETag"], "PartNumber": number})

        part_size = self.part_size
        try:
            # ``buffer`` holds a little more than one part. It becomes the part buffer: filled in
            # place, sent as is (botocore takes a bytearray body) and refilled once the synchronous
            # upload returns, so memory stays at one part instead of a part plus its copy.
            tail = bytes(buffer[part_size:])  # at most one chunk
            del buffer[part_size:]
            send(buffer)
            filled = 0

            def add(data: bytes) -> None:
                nonlocal filled
                view = memoryview(data)
                offset = 0
                while offset < len(view):
                    take = min(part_size - filled, len(view) - offset)
                    buffer[filled : filled + take] = view[offset : offset + take]
                    filled += take
                    offset += take
                    if filled == part_size:
                        send(buffer)
                        filled = 0

            add(tail)
            del tail
            for chunk in rest:
                digest.update(chunk)
                size += len(chunk)
                add(chunk)
            if filled:
                del buffer[filled:]
                send(buffer)
            client.complete_multipart_upload(
                Bucket=self.bucket, Key=full_key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            # Aborting is best effort: the original failure is the one worth raising.
            with contextlib.suppress(Exception):
                client.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id)
            raise
        return StoredObject(key, size, self.url(full_key), digest.hexdigest())

    def exists(self, key: str) -> bool:
        """True when an object is stored at ``key``."""
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self.full_key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING_CODES:
                return False
            raise
        return True

    def read_bytes(self, key: str) -> bytes:
        """The whole object (meant for tests and small objects); ``FileNotFoundError`` if absent."""
        from botocore.exceptions import ClientError

        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.full_key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING_CODES:
                raise FileNotFoundError(f"no media object at {key!r}") from None
            raise
        body: bytes = answer["Body"].read()
        return body

    def delete(self, key: str) -> None:
        """Remove the object at ``key``; absent is fine."""
        self.client.delete_object(Bucket=self.bucket, Key=self.full_key(key))
