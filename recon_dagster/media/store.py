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
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from recon_dagster.config import Settings, is_set, settings
from recon_dagster.media.base import (
    DEFAULT_MEDIA_DIR,
    DEFAULT_PART_SIZE,
    MIB,
    S3_MIN_PART_SIZE,
    DelegatesToWriter,
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
    "DelegatesToWriter",
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
    now = settings()
    bucket = now.s3_bucket
    if not bucket:
        return LocalMediaStore(base_dir=now.media_dir or os.path.join(os.getcwd(), DEFAULT_MEDIA_DIR))
    from dagster_aws.s3 import S3Resource

    from recon_dagster.media.s3_store import S3MediaStore

    s3_fields: dict[str, Any] = {}
    for field, var in (
        ("endpoint_url", Settings.s3_endpoint_url.name),
        ("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
        ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
        ("region_name", "AWS_REGION"),
    ):
        # Unset variables stay unset so boto3's own credential chain (roles, profiles) applies.
        if is_set(var):
            s3_fields[field] = dg.EnvVar(var)
    return S3MediaStore(
        s3=S3Resource(**s3_fields),
        bucket=bucket,
        prefix=now.s3_prefix,
        public_base_url=now.s3_public_base_url or None,
    )


def __getattr__(name: str) -> Any:
    # The S3 names, loaded on first use (see the module docstring).
    if name in ("S3MediaStore", "s3_client_settings"):
        from recon_dagster.media import s3_store

        return getattr(s3_store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
