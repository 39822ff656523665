"""Media: SSRF-guarded streaming download, MediaStore (local folder or S3/R2), watermark.

Names are loaded on first use, so importing the download guard does not import dagster/boto3.
Only ``LocalMediaStore``, ``S3MediaStore`` and ``media_store_from_env`` (the Dagster resources)
import dagster; the writers ``FolderWriter`` and ``S3Writer`` and the keys do not.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MediaStream": "download",
    "allowed_hosts_from_env": "download",
    "check_url": "download",
    "is_public_address": "download",
    "open_media_stream": "download",
    "MediaError": "errors",
    "MediaExpired": "errors",
    "MediaFetchError": "errors",
    "MediaNotImage": "errors",
    "MediaRefused": "errors",
    "MediaTooLarge": "errors",
    "redact_url": "errors",
    "MediaStore": "base",
    "StoredObject": "base",
    "guess_ext": "base",
    "media_key": "base",
    "FolderWriter": "folder",
    "S3ClientSettings": "s3",
    "S3Writer": "s3",
    "build_s3_client": "s3",
    "shared_s3_client": "s3",
    "LocalMediaStore": "store",
    "S3MediaStore": "s3_store",
    "media_store_from_env": "store",
    "fetch_bytes": "transfer",
    "fetch_to_store": "transfer",
    "watermark_image": "watermark",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
