"""Dagster resources for where finished media lands: ``LocalMediaStore`` (the default) and
``S3MediaStore`` (S3/R2 through dagster-aws ``S3Resource``, in ``s3_store``).

They are thin wrappers: the writing lives in ``folder.FolderWriter`` and ``s3.S3Writer``, which
import no Dagster, so a process that only moves bytes need not pay ~70 MB for dagster and
dagster_aws. Keys, ``StoredObject`` and the ``MediaStore`` protocol live in ``base`` and are
re-exported here so existing imports keep working.

``S3MediaStore`` is imported only when it is used (``RECON_S3_BUCKET`` set, or the name asked
for): importing dagster_aws pulls in its components, boto3 and more, which took ~40% of the
code location's import in every run worker of a deployment with local media.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from recon_dagster import config
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

if TYPE_CHECKING:
    from recon_dagster.media.s3_store import S3MediaStore

__all__ = [
    "DEFAULT_MEDIA_DIR",
    "DEFAULT_PART_SIZE",
    "MIB",
    "S3_MIN_PART_SIZE",
    "LocalMediaStore",
    "MediaStore",
    "StoredObject",
    "guess_ext",
    "media_folder",
    "media_key",
    "media_store_from_env",
    "validate_key",
]


# --- local folder -----------------------------------------------------------------------------


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


class LocalMediaStore(DelegatesToWriter, dg.ConfigurableResource):  # type: ignore[type-arg]  # bare, as Dagster's own: its parameter is the resource itself
    """Media in a local folder (the default; ``RECON_MEDIA_DIR``); writes are temp file + rename."""

    base_dir: str = Field(description="Folder that holds the media tree.")

    def writer(self) -> FolderWriter:
        """The Dagster-free writer this resource delegates to."""
        return FolderWriter(self.base_dir)


# --- configuration ----------------------------------------------------------------------------


def media_store_from_env() -> LocalMediaStore | S3MediaStore:
    """``S3MediaStore`` when ``RECON_S3_BUCKET`` is set, else ``LocalMediaStore(RECON_MEDIA_DIR)``.

    Credentials and endpoint are passed as ``dg.EnvVar`` so their values never enter run config.
    Optional: ``RECON_S3_PREFIX``, ``RECON_S3_PUBLIC_BASE_URL``.
    """
    bucket = config.get("RECON_S3_BUCKET")
    if not bucket:
        return LocalMediaStore(base_dir=config.get("RECON_MEDIA_DIR") or os.path.join(os.getcwd(), DEFAULT_MEDIA_DIR))
    from dagster_aws.s3 import S3Resource

    from recon_dagster.media.s3_store import S3MediaStore

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


def __getattr__(name: str) -> Any:
    # The S3 names, loaded on first use (see the module docstring).
    if name in ("S3MediaStore", "s3_client_settings"):
        from recon_dagster.media import s3_store

        return getattr(s3_store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
