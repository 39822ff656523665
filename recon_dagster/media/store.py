"""Dagster resources for where finished media lands: ``LocalMediaStore`` (the default) and
``S3MediaStore`` (S3/R2 through dagster-aws ``S3Resource``).

They are thin wrappers: the writing lives in ``folder.FolderWriter`` and ``s3.S3Writer``, which
import no Dagster, so a process that only moves bytes need not pay ~70 MB for dagster and
dagster_aws. Keys, ``StoredObject`` and the ``MediaStore`` protocol live in ``base`` and are
re-exported here so existing imports keep working.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import Field, PrivateAttr

from recon_dagster import config
from recon_dagster.core.redaction import register_secret
from recon_dagster.media.base import (
    DEFAULT_MEDIA_DIR,
    DEFAULT_PART_SIZE,
    MIB,
    S3_MIN_PART_SIZE,
    MediaStore,
    StoredObject,
    guess_ext,
    media_folder,
    media_key,
    validate_key,
)
from recon_dagster.media.folder import FolderWriter
from recon_dagster.media.s3 import S3ClientSettings, S3Writer, shared_s3_client

__all__ = [
    "DEFAULT_MEDIA_DIR",
    "DEFAULT_PART_SIZE",
    "MIB",
    "S3_MIN_PART_SIZE",
    "LocalMediaStore",
    "MediaStore",
    "S3MediaStore",
    "StoredObject",
    "guess_ext",
    "media_folder",
    "media_key",
    "media_store_from_env",
    "s3_client_settings",
    "validate_key",
]


# --- local folder -----------------------------------------------------------------------------


class _DelegatesToWriter:
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


class LocalMediaStore(_DelegatesToWriter, dg.ConfigurableResource):
    """Media in a local folder (the default; ``RECON_MEDIA_DIR``); writes are temp file + rename."""

    base_dir: str = Field(description="Folder that holds the media tree.")

    def writer(self) -> FolderWriter:
        """The Dagster-free writer this resource delegates to."""
        return FolderWriter(self.base_dir)


# --- S3 / R2 ----------------------------------------------------------------------------------


def s3_client_settings(s3: S3Resource) -> S3ClientSettings:
    """The plain client settings of an ``S3Resource`` (``EnvVar`` fields resolved)."""
    # process_config_and_initialize resolves EnvVar fields also outside a Dagster run.
    resolved = s3.process_config_and_initialize()
    register_secret(resolved.aws_secret_access_key)  # masked wherever a message might carry it
    register_secret(resolved.aws_session_token)
    return S3ClientSettings(
        region_name=resolved.region_name,
        endpoint_url=resolved.endpoint_url,
        max_attempts=resolved.max_attempts,
        profile_name=resolved.profile_name,
        use_ssl=resolved.use_ssl,
        verify=resolved.verify,
        use_unsigned_session=resolved.use_unsigned_session,
        aws_access_key_id=resolved.aws_access_key_id,
        aws_secret_access_key=resolved.aws_secret_access_key,
        aws_session_token=resolved.aws_session_token,
    )


class S3MediaStore(_DelegatesToWriter, dg.ConfigurableResource):
    """Media in an S3-compatible bucket (R2 via ``S3Resource(endpoint_url=...)``).

    Objects up to ``part_size`` go in one PutObject; larger ones stream as a multipart upload one
    part at a time (memory ~ part size), aborted if anything fails so no partial object appears.
    A ``part_size`` below 5 MiB is refused with ``ValueError`` on first use.
    """

    s3: S3Resource
    bucket: str = Field(description="Bucket name.")
    prefix: str = Field(default="", description="Key prefix inside the bucket, e.g. 'media/'.")
    part_size: int = Field(default=DEFAULT_PART_SIZE, description="Multipart part size in bytes (>= 5 MiB).")
    public_base_url: str | None = Field(
        default=None, description="Public URL of the bucket root; when unset urls are s3://bucket/key."
    )

    _writer: S3Writer | None = PrivateAttr(default=None)
    _writer_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __repr__(self) -> str:
        # The nested S3Resource holds resolved credentials once Dagster has processed the config.
        return f"S3MediaStore(bucket={self.bucket!r}, prefix={self.prefix!r}, part_size={self.part_size})"

    __str__ = __repr__

    def writer(self) -> S3Writer:
        """The Dagster-free writer this resource delegates to (built once, client shared per process)."""
        if self._writer is None:
            with self._writer_lock:
                if self._writer is None:
                    s3 = self.s3
                    self._writer = S3Writer(
                        self.bucket,
                        # Credentials resolve when the first request needs a client, as before.
                        client_factory=lambda: shared_s3_client(s3_client_settings(s3)),
                        prefix=self.prefix,
                        part_size=self.part_size,
                        public_base_url=self.public_base_url,
                    )
        return self._writer

    def _get_client(self) -> Any:
        return self.writer().client


# --- configuration ----------------------------------------------------------------------------


def media_store_from_env() -> LocalMediaStore | S3MediaStore:
    """``S3MediaStore`` when ``RECON_S3_BUCKET`` is set, else ``LocalMediaStore(RECON_MEDIA_DIR)``.

    Credentials and endpoint are passed as ``dg.EnvVar`` so their values never enter run config.
    Optional: ``RECON_S3_PREFIX``, ``RECON_S3_PUBLIC_BASE_URL``.
    """
    bucket = config.get("RECON_S3_BUCKET")
    if not bucket:
        return LocalMediaStore(base_dir=config.get("RECON_MEDIA_DIR") or os.path.join(os.getcwd(), DEFAULT_MEDIA_DIR))
    s3_fields: dict[str, Any] = {}
    for field, var in (
        ("endpoint_url", "RECON_S3_ENDPOINT_URL"),
        ("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
        ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
        ("region_name", "AWS_REGION"),
    ):
        # Unset variables stay unset so boto3's own credential chain (roles, profiles) applies.
        if config.is_set(var):
            s3_fields[field] = dg.EnvVar(var)
    return S3MediaStore(
        s3=S3Resource(**s3_fields),
        bucket=bucket,
        prefix=config.get("RECON_S3_PREFIX"),
        public_base_url=config.get("RECON_S3_PUBLIC_BASE_URL") or None,
    )
