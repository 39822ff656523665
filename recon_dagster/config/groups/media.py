"""Recovered media: where it is stored, what may be downloaded and how fast, video watermark caps.

A group of ``recon_dagster.config.Settings`` (it inherits this class): see that package."""

from __future__ import annotations

from recon_dagster.config.parse import (
    host_list,
    positive,
    text,
)
from recon_dagster.config.var import POSITIVE, named, setting


class MediaGroup:
    __slots__ = ()

    # fmt: off
    # media
    media_dir = setting(
        "media", "path", None, "Where recovered media is stored when no S3 bucket is configured.", parse=text,
        shown_default="`./.recon/media`",
    )
    media_allowed_hosts = setting(
        "media", "host list", frozenset[str](),
        "Comma-separated `host[:port]` allowed past the media-download guard (otherwise only `https` URLs on "
        "public addresses are fetched); listed hosts may use http. The sandbox needs its loopback address "
        "here.",
        parse=host_list, bounds="hosts; ports 1-65535; IPv6 in brackets", shown_default="—",
    )
    media_deadline_s = setting(
        "media", "seconds", 600.0,
        "Overall deadline of all media downloads of one finalize (with the 60 s poll, well inside the 900 s "
        "lease); headers that drip a line at a time end there too, the socket closed.",
        parse=positive(float), bounds=POSITIVE,
    )
    media_min_bytes_per_s = setting(
        "media", "bytes per second", 1024.0 * 1024.0,
        "An object that declares its size gets 30 s + size / this rate of the media deadline, so a stalled "
        "small image fails in seconds.",
        parse=positive(float), bounds=POSITIVE, shown_default="1048576 (1 MiB/s)",
    )
    video_max_duration_s = setting(
        "media", "seconds", 1800.0,
        "Most seconds of video one job's videos may have to be watermarked (all of them together, as the "
        "container declares them and as they decode); past it the job is not completed: a `watermark_failed` "
        "anomaly, the attempt counted.",
        parse=positive(float), bounds=POSITIVE,
    )
    video_max_frames = setting(
        "media", "whole number", 108_000,
        "Most video frames one job's videos may have to be watermarked (30 minutes at 60 fps); past it as "
        "above.",
        parse=positive(int), bounds=POSITIVE,
    )
    video_max_pixels = setting(
        "media", "whole number", 60_000_000_000,
        "Most pixels (frames x width x height) one job's videos may have to be watermarked (about 1080p for "
        "16 minutes at 30 fps); past it as above.",
        parse=positive(int), bounds=POSITIVE, shown_default="60000000000 (6e10)",
    )
    video_encode_deadline_s = setting(
        "media", "seconds", 300.0,
        "Wall time one job's video re-encoding may take, and never past the finalize's "
        "`RECON_MEDIA_DEADLINE_S`, so poll, media and encode end inside the lease; past it as above.",
        parse=positive(float), bounds=POSITIVE,
    )
    s3_bucket = setting(
        "media", "text", None, "Store media in this S3/R2 bucket instead of a folder.", parse=text,
        shown_default="—",
    )
    s3_endpoint_url = named(
        "media", "URL", None,
        "S3-compatible endpoint (Cloudflare R2, MinIO, a test server); passed as dg.EnvVar.",
        shown_default="AWS",
    )
    s3_prefix = setting("media", "text", "", "Key prefix in the bucket.", parse=text, shown_default="—")
    s3_public_base_url = setting(
        "media", "URL", None, "Public URL base recorded on assets.", parse=text, shown_default="—",
    )
    # fmt: on
