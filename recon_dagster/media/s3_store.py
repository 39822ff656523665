"""``S3MediaStore``: media in an S3/R2 bucket through dagster-aws ``S3Resource``.

Its own module, imported only when used (``recon_dagster.media.store`` explains why).
"""

from __future__ import annotations

import threading
from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import Field, PrivateAttr

from recon_dagster.core.redaction import register_secret
from recon_dagster.media.base import DEFAULT_PART_SIZE, DelegatesToWriter
from recon_dagster.media.s3 import S3ClientSettings, S3Writer, shared_s3_client


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


class S3MediaStore(DelegatesToWriter, dg.ConfigurableResource):  # type: ignore[type-arg]  # bare, as Dagster's own: its parameter is the resource itself
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
