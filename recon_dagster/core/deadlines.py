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

Per-read timeouts are not enough either: a host that sends its headers one line a second resets
them with every line, and httpx reads headers inside one call. So every step of an exchange run
under ``exchange_deadline`` is cut to what is left of the overall deadline (``guard_transports``,
on httpx's own transport): resolving the host's name (``core.dns``: ``getaddrinfo`` itself takes
no timeout), connecting, TLS, the proxy's ``CONNECT``, and every socket read and write, body
included; past it the step fails, the connection is closed, and the error says how long the
exchange waited. A name's resolution and the TCP connect together also stay within the request's
connect timeout, as curl's connect timeout does.
"""

from __future__ import annotations

import threading
import time
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import httpcore
import httpx

from recon_dagster.config import Settings, settings
from recon_dagster.core import dns
from recon_dagster.core.proxy import open_tunnel
from recon_dagster.core.tls import shared_tls_context

DEFAULT_POLL_DEADLINE_S = Settings.poll_deadline_s.default
DEFAULT_POLL_MAX_BYTES = Settings.poll_max_bytes.default
DEFAULT_MEDIA_DEADLINE_S = Settings.media_deadline_s.default
DEFAULT_MEDIA_MIN_BYTES_PER_S = Settings.media_min_bytes_per_s.default
# Connect, TLS and first byte of a media object whatever its size.
MEDIA_FLOOR_S = 30.0


def poll_deadline_s(environ: Mapping[str, str] | None = None) -> float:
    return settings(environ).poll_deadline_s


def poll_max_bytes(environ: Mapping[str, str] | None = None) -> int:
    return settings(environ).poll_max_bytes


def media_deadline_s(environ: Mapping[str, str] | None = None) -> float:
    return settings(environ).media_deadline_s


def media_min_bytes_per_s(environ: Mapping[str, str] | None = None) -> float:
    return settings(environ).media_min_bytes_per_s


def stale_part_age_s() -> float:
    """Age past which a partial media write is dead: the reconcile lease (``RECON_LEASE_S``,
    900 s), longer than any download's deadline."""
    return settings().lease_s


def sized_deadline_s(size: int | None, remaining_s: float, min_bytes_per_s: float | None) -> float:
    """Time one media object may take: its share by declared size, never more than what is left."""
    if size is None or not min_bytes_per_s:
        return remaining_s
    return min(remaining_s, MEDIA_FLOOR_S + size / min_bytes_per_s)


# -- one overall deadline per exchange, at the socket ------------------------------------------


class _Exchange(typing.NamedTuple):
    started: float
    at: float
    limit_s: float

    def expired(self) -> str:
        waited = time.monotonic() - self.started
        return f"overall deadline of {self.limit_s:g} s passed (waited {waited:.1f} s)"


_current = threading.local()


def _exchange() -> _Exchange | None:
    return getattr(_current, "exchange", None)


@contextmanager
def exchange_deadline(at: float | None, started: float | None = None) -> Iterator[None]:
    """Run the socket I/O of this thread's exchange under the monotonic deadline ``at`` (None: no
    overall deadline); ``started`` (default now) is when the exchange began, for the message."""
    outer = _exchange()
    now = time.monotonic()
    start = now if started is None else started
    _current.exchange = None if at is None else _Exchange(start, at, max(0.0, at - start))
    try:
        yield
    finally:
        _current.exchange = outer


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of the thread's exchange deadline; past it, ``error``."""
    ex = _exchange()
    if ex is None:
        return timeout
    left = ex.at - time.monotonic()
    if left <= 0:
        raise error(ex.expired())
    return left if timeout is None else min(timeout, left)


def left_of_exchange(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of this thread's ``exchange_deadline`` (None: no limit);
    raises ``error`` naming the deadline once it has passed. For a step the guarded transport does
    not take itself (the media guard's own name resolution)."""
    return _left(timeout, error)


_T = typing.TypeVar("_T")


class _DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every read and write ends by the exchange's overall deadline."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def _timed(
        self, call: typing.Callable[[float | None], _T], timeout: float | None, error: type[Exception]
    ) -> _T:
        cut = _left(timeout, error)
        try:
            return call(cut)
        except error:
            ex = _exchange()
            if ex is not None and time.monotonic() >= ex.at:
                raise error(ex.expired()) from None
            raise

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._timed(lambda t: self._stream.read(max_bytes, t), timeout, httpcore.ReadTimeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._timed(lambda t: self._stream.write(buffer, t), timeout, httpcore.WriteTimeout)

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: typing.Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._timed(
            lambda t: self._stream.start_tls(ssl_context, server_hostname, t),
            timeout,
            httpcore.ConnectTimeout,
        )
        return _DeadlineStream(stream)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """Connects by the exchange's deadline: the name resolved within it (``core.dns``), each
    address tried in the resolver's order with what is left, through a ``CONNECT`` tunnel when
    ``tunnel`` names a proxy (``core.proxy``); the stream returned is a ``_DeadlineStream``."""

    def __init__(self, backend: httpcore.NetworkBackend, tunnel: httpx.Proxy | None = None) -> None:
        self._backend = backend
        self._tunnel = tunnel

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        cut = _left(timeout, httpcore.ConnectTimeout)
        until = None if cut is None else time.monotonic() + cut
        if self._tunnel is None:
            return self._connect(host, port, until, local_address, socket_options)
        proxy = self._tunnel.url
        proxy_port = proxy.port or (443 if proxy.scheme == "https" else 80)
        stream = self._connect(proxy.host, proxy_port, until, local_address, socket_options)
        try:
            if proxy.scheme == "https":
                context = self._tunnel.ssl_context or shared_tls_context()
                stream = stream.start_tls(context, proxy.host, _until(until))
            return open_tunnel(stream, self._tunnel, host, port, _until(until))  # over the guarded stream
        except BaseException:
            stream.close()
            raise

    def _connect(
        self,
        host: str,
        port: int,
        until: float | None,
        local_address: str | None,
        socket_options: typing.Iterable[typing.Any] | None,
    ) -> httpcore.NetworkStream:
        try:
            addresses = dns.resolve(host, port, _until(until))
        except dns.ResolveTimeout as exc:
            _left(None, httpcore.ConnectTimeout)  # names the overall deadline when that is what passed
            raise httpcore.ConnectTimeout(str(exc)) from None
        except OSError as exc:  # the name does not resolve: nothing was sent
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from None
        if not addresses:
            raise httpcore.ConnectError(f"{host!r} resolved to no address")
        options = list(socket_options or ())
        failure: httpcore.ConnectError | None = None
        for address in addresses:
            try:
                connected = self._backend.connect_tcp(address, port, _until(until), local_address, options)
            except httpcore.ConnectError as exc:  # refused or unreachable: the next address may answer
                failure = exc
                continue
            except httpcore.ConnectTimeout:
                _left(None, httpcore.ConnectTimeout)
                raise
            return _DeadlineStream(connected)
        assert failure is not None
        raise failure

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        cut = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, cut, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def _until(at: float | None) -> float | None:
    """Seconds left before the monotonic time ``at`` (None: no limit), cut to the exchange's
    deadline; ``ConnectTimeout`` once either has passed."""
    if at is None:
        return _left(None, httpcore.ConnectTimeout)
    left = at - time.monotonic()
    if left <= 0:
        _left(None, httpcore.ConnectTimeout)
        raise httpcore.ConnectTimeout("timed out while connecting")
    return _left(left, httpcore.ConnectTimeout)


def guard_transport(
    transport: httpx.BaseTransport, *, tunnel: httpx.Proxy | None = None
) -> httpx.BaseTransport:
    """``transport`` (httpx's own) with every connection it opens bound by ``exchange_deadline``,
    and opened through a ``CONNECT`` tunnel to ``tunnel`` when given (returned for chaining).

    httpx has no public hook for the network backend of its own transport, so the pool's backend
    is wrapped in place; a test pins that this keeps working across httpx upgrades
    (``test_header_drip``), and a transport of another shape is refused rather than left unguarded.
    """
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is None:
        raise TypeError(f"cannot bound the exchanges of {type(transport).__name__}: no network backend")
    if isinstance(backend, _DeadlineBackend):
        if backend._tunnel is not tunnel:
            raise ValueError("this transport is already guarded with another tunnel")
        return transport
    pool._network_backend = _DeadlineBackend(backend, tunnel)  # type: ignore[union-attr]  # not None: its backend was read above
    return transport


def guard_transports(client: httpx.Client) -> httpx.Client:
    """``client`` with every transport it routes to (its proxies' included) guarded by
    ``guard_transport`` (returned for chaining)."""
    for transport in [client._transport, *(t for t in client._mounts.values() if t is not None)]:
        guard_transport(transport)
    return client
