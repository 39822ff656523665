"""Overall deadlines and size caps for what comes over the network, and their env settings.

A per-read timeout never fires against a server that drips one byte every few seconds, so every
poll and every media transfer also has a total deadline, well inside the reconcile lease
(``RECON_LEASE_S``, 900 s): a job's poll (60 s) plus its media (600 s at most, all objects
together) plus the settle transaction end before another run may take the job over.

- ``RECON_POLL_DEADLINE_S`` (60): one poll or read, retries and backoff included. Provider status
  answers are small and normally take well under a second; 60 s still covers a few honoured
  ``Retry-After`` waits.
- ``RECON_POLL_MAX_BYTES`` (8 MiB): decoded size of one provider answer. Status bodies are a few
  KiB; the cap is counted after decompression, so a gzip bomb stops at the cap.
- ``RECON_MEDIA_DEADLINE_S`` (600): all media of one finalize together.
- ``RECON_MEDIA_MIN_BYTES_PER_S`` (1 MiB/s): an object that declares its size gets
  ``MEDIA_FLOOR_S + size / rate`` of that budget, so a small image stalled by a drip fails in
  seconds instead of holding the job for ten minutes.
"""

from __future__ import annotations

import os

POLL_DEADLINE_ENV = "RECON_POLL_DEADLINE_S"
POLL_MAX_BYTES_ENV = "RECON_POLL_MAX_BYTES"
MEDIA_DEADLINE_ENV = "RECON_MEDIA_DEADLINE_S"
MEDIA_MIN_RATE_ENV = "RECON_MEDIA_MIN_BYTES_PER_S"

DEFAULT_POLL_DEADLINE_S = 60.0
DEFAULT_POLL_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_MEDIA_DEADLINE_S = 600.0
DEFAULT_MEDIA_MIN_BYTES_PER_S = 1024.0 * 1024.0
# Connect, TLS and first byte of a media object whatever its size.
MEDIA_FLOOR_S = 30.0


def env_positive(name: str, default: float) -> float:
    """A positive number from the environment (``default`` when unset); a bad value is a
    ``ValueError`` naming the variable."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a positive finite number, got {raw!r}")
    return value


def poll_deadline_s() -> float:
    return env_positive(POLL_DEADLINE_ENV, DEFAULT_POLL_DEADLINE_S)


def poll_max_bytes() -> int:
    return int(env_positive(POLL_MAX_BYTES_ENV, DEFAULT_POLL_MAX_BYTES))


def media_deadline_s() -> float:
    return env_positive(MEDIA_DEADLINE_ENV, DEFAULT_MEDIA_DEADLINE_S)


def media_min_bytes_per_s() -> float:
    return env_positive(MEDIA_MIN_RATE_ENV, DEFAULT_MEDIA_MIN_BYTES_PER_S)


def stale_part_age_s() -> float:
    """Age past which a partial media write is dead: the reconcile lease (``RECON_LEASE_S``,
    900 s), longer than any download's deadline."""
    return env_positive("RECON_LEASE_S", 900.0)


def sized_deadline_s(size: int | None, remaining_s: float, min_bytes_per_s: float | None) -> float:
    """Time one media object may take: its share by declared size, never more than what is left."""
    if size is None or not min_bytes_per_s:
        return remaining_s
    return min(remaining_s, MEDIA_FLOOR_S + size / min_bytes_per_s)
