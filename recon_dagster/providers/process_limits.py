"""This process's own limits on one provider account: its concurrency slots, its token buckets
and, with ``RECON_LIMITS=process``, the provider's Retry-After it heard. Shared by every resource
copy and thread of the process (``shared_limiter``); ``providers/limits.py`` is the account budget
shared by every process through PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class TokenBucket:
    """A thread-safe token bucket: ``rate`` tokens per second, bursts up to ``burst``.

    A caller reserves its token at once (the balance may go negative) and then sleeps outside the
    lock until that token exists, so waiting threads are served in arrival order.
    """

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"token bucket needs rate_per_s > 0 and burst >= 1, got {rate_per_s}, {burst}")
        self.rate = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()
        self._lock = threading.Lock()

    def reserve(self, max_wait: float | None = None) -> float | None:
        """Take one token; returns how many seconds the caller must wait before using it. With
        ``max_wait``, a token that comes later is not taken: None (the bucket is left as it was)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            wait = max(0.0, 1.0 - self._tokens) / self.rate
            if max_wait is not None and wait > max_wait:
                return None
            self._tokens -= 1.0
            return wait

    def next_token_s(self) -> float:
        """Seconds until the next token exists (0: one is there)."""
        with self._lock:
            tokens = min(self.burst, self._tokens + (self._clock() - self._stamp) * self.rate)
            return max(0.0, 1.0 - tokens) / self.rate

    def acquire(self, sleep: Callable[[float], None] = time.sleep) -> float:
        """Block until a token is available; returns the seconds waited."""
        wait = self.reserve() or 0.0
        if wait > 0:
            sleep(wait)
        return wait


@dataclass(frozen=True)
class Limits:
    """Concurrency and rate limits of one provider account, as configured."""

    max_concurrency: int = 16
    create_rate_per_s: float | None = None
    create_burst: int = 1
    read_rate_per_s: float | None = None
    read_burst: int = 1


@dataclass
class _SharedLimiter:
    semaphore: threading.BoundedSemaphore
    create_bucket: TokenBucket | None
    read_bucket: TokenBucket | None
    # A provider's Retry-After, when this process keeps its own limits (``RECON_LIMITS=process``):
    # every request of the process to the account waits it out, not only the one that heard it.
    blocked_until: float = 0.0  # time.monotonic()
    lock: threading.Lock = field(default_factory=threading.Lock)

    def block_for(self, seconds: float) -> None:
        with self.lock:
            self.blocked_until = max(self.blocked_until, time.monotonic() + seconds)

    def blocked_s(self) -> float:
        """Seconds the account is still blocked by a Retry-After this process heard (0: not)."""
        return max(0.0, self.blocked_until - time.monotonic())


_LIMITERS: dict[tuple[Any, ...], _SharedLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def shared_limiter(provider: str, base_url: str, limits: Limits) -> _SharedLimiter:
    """The process-wide limiter of one provider account: every resource copy and thread shares it."""
    key = (provider, base_url.rstrip("/"), limits)
    with _LIMITERS_LOCK:
        limiter = _LIMITERS.get(key)
        if limiter is None:
            limiter = _SharedLimiter(
                threading.BoundedSemaphore(limits.max_concurrency),
                TokenBucket(limits.create_rate_per_s, limits.create_burst)
                if limits.create_rate_per_s
                else None,
                TokenBucket(limits.read_rate_per_s, limits.read_burst) if limits.read_rate_per_s else None,
            )
            _LIMITERS[key] = limiter
        return limiter
