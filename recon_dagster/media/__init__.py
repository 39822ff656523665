"""Media: SSRF-guarded streaming download, MediaStore (local folder or S3/R2), watermark."""

from recon_dagster.media.download import (
    MediaStream,
    allowed_hosts_from_env,
    check_url,
    is_public_address,
    open_media_stream,
)
from recon_dagster.media.errors import (
    MediaError,
    MediaExpired,
    MediaFetchError,
    MediaNotImage,
    MediaRefused,
    MediaTooLarge,
    redact_url,
)
from recon_dagster.media.store import (
    LocalMediaStore,
    MediaStore,
    S3MediaStore,
    StoredObject,
    guess_ext,
    media_key,
    media_store_from_env,
)
from recon_dagster.media.transfer import fetch_bytes, fetch_to_store
from recon_dagster.media.watermark import watermark_image

__all__ = [
    "LocalMediaStore",
    "MediaError",
    "MediaExpired",
    "MediaFetchError",
    "MediaNotImage",
    "MediaRefused",
    "MediaStore",
    "MediaStream",
    "MediaTooLarge",
    "S3MediaStore",
    "StoredObject",
    "allowed_hosts_from_env",
    "check_url",
    "fetch_bytes",
    "fetch_to_store",
    "guess_ext",
    "is_public_address",
    "media_key",
    "media_store_from_env",
    "open_media_stream",
    "redact_url",
    "watermark_image",
]
