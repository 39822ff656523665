"""Name resolution that ends by a deadline.

``socket.getaddrinfo`` takes no timeout: a resolver that does not answer holds the calling thread
for as long as the system's resolver retries (``resolv.conf``'s timeout times its attempts times
its servers: 10 s to minutes), and a poll's or a download's overall deadline would not end it.
Every name the provider clients and the media downloads resolve (a provider's host, a media host
before its address is checked, a proxy's host) is resolved here instead, on a small pool of worker
threads, and the caller waits at most the time it has left.

A lookup cannot be cancelled once the system resolver has it: when the caller gives up, the worker
finishes the lookup on its own and its answer is dropped. The pool is small and bounded (a hung
resolver holds at most ``WORKERS`` threads; further lookups wait for a free one, and their callers
still give up at their own deadlines), and a process forked from one that used it builds its own.
Addresses (``127.0.0.1``, ``::1``) are not looked up at all.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import os
import socket
import threading
import time

WORKERS = 8

_pool: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


class ResolveTimeout(TimeoutError):
    """The name was not resolved in the time the caller had left."""


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        # A forked child has none of its parent's worker threads: it must not wait on them.
        if _pool is None or _pool[0] != os.getpid():
            _pool = (
                os.getpid(),
                concurrent.futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="recon-dns"),
            )
        return _pool[1]


def is_address(host: str) -> bool:
    """True when ``host`` is an IPv4 or IPv6 address (brackets allowed), not a name."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _lookup(host: str, port: int) -> list[str]:
    # socket.getaddrinfo is looked up at call time, so a test can stand a hanging resolver in.
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    addresses: list[str] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        address = str(sockaddr[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


def resolve(host: str, port: int, timeout_s: float | None) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order; ``ResolveTimeout`` when the
    answer takes longer than ``timeout_s`` (None: as long as the system resolver takes), and the
    resolver's own ``OSError`` (``socket.gaierror``) when the name does not resolve."""
    if is_address(host):
        return [host.strip("[]")]
    if timeout_s is None:
        return _lookup(host, port)
    started = time.monotonic()
    future = _executor().submit(_lookup, host, port)
    try:
        return future.result(timeout=max(0.0, timeout_s))
    except concurrent.futures.TimeoutError:
        future.cancel()  # still queued behind hung lookups: never run it
        waited = time.monotonic() - started
        raise ResolveTimeout(
            f"resolving {host!r} took longer than {timeout_s:.3g} s (waited {waited:.1f} s)"
        ) from None


__all__ = ["ResolveTimeout", "WORKERS", "is_address", "resolve"]
