"""``Http11Transport``: httpx's transport interface over the standard library's HTTP/1.1 parser.

Every reconciled job sends a provider poll and a media download, and with sixteen jobs in flight
per run the default transport (httpcore's pool and h11's pure-Python state machine) was the
largest single cost of a run worker. Measured on the project's 2-core machine against a loopback
server answering after 100 ms, sixteen threads, CPU per request: a poll through the default
transport 500-640 us, a 16 KiB download on a fresh connection 665-836 us; through this transport
390-430 us and 450 us (the rest is httpx's request and response objects; the bare ``http.client``
exchange is 165-200 us). This transport keeps httpx's ``Client``, ``Request`` and ``Response``
(headers, content decoding, size caps and errors are httpx's as before) and replaces only the
exchange underneath: the request head and body go out in one write, the answer is parsed by
``http.client`` (its limits: 100 headers, 64 KiB per line) and streamed chunk by chunk as the
socket delivers it.

What the default transport did that still matters is kept:

- **Errors** are httpx's, with the same meaning for the retry policy: ``ConnectError`` and
  ``ConnectTimeout`` only before a byte of the request was written (safe to retry, creates
  included); ``WriteError``/``WriteTimeout``, ``ReadError``/``ReadTimeout`` and
  ``RemoteProtocolError`` (a disconnect, a malformed answer, a body shorter than its
  ``Content-Length``) after. A header value holding CR, LF or NUL is refused
  (``LocalProtocolError``) before anything is sent.
- **Timeouts** are the request's (``connect``, ``read``, ``write``), and every socket read, write
  and connect is also cut to what is left of the thread's ``exchange_deadline``, so a server that
  drips its headers a line at a time still ends by the overall deadline.
- **TLS** uses the given context; the ``sni_hostname`` extension names the server for SNI and the
  certificate check (a media hop pinned to an address), else the URL's host does.
- **Keep-alive** (``max_idle`` > 0): a connection goes back to its pool only after its answer was
  read to the end and the server did not ask to close it. Pools are keyed by scheme, address, port
  and TLS name; an idle connection is dropped after ``keepalive_expiry_s`` or when the server has
  closed it (its socket is readable while idle). ``max_idle=0`` opens a connection per request
  (the media downloads: a connection opened to one pinned address must never carry another host).
- Proxies: a client that mounts a proxy keeps httpx's own transport for those URLs.
"""

from __future__ import annotations

import http.client
import io
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from recon_dagster.core.deadlines import left_of_exchange
from recon_dagster.core.tls import shared_tls_context

_DEFAULT_PORTS = {b"http": 80, b"https": 443}
_CHUNK = 64 * 1024
_SHORT_BODY = "peer closed connection without sending complete message body"
# A pool's key: scheme, address, port and the TLS name (None: the address's own).
_Key = tuple[bytes, str, int, str | None]
_ILLEGAL_IN_HEADER = re.compile(rb"[\r\n\0]")


class _Reader(io.RawIOBase):
    """The socket's receive side for one answer: every read waits at most the read timeout, cut to
    the exchange deadline. Closing it leaves the socket open (the connection may be reused)."""

    def __init__(self, sock: socket.socket, read_timeout: float | None) -> None:
        self._sock = sock
        self._timeout = read_timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(left_of_exchange(self._timeout, httpx.ReadTimeout))
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            left_of_exchange(0.0, httpx.ReadTimeout)  # past the deadline: say so
            raise httpx.ReadTimeout("timed out") from None


class _AnswerSocket:
    """What ``http.client.HTTPResponse`` asks of a socket: one buffered file to parse from."""

    def __init__(self, reader: io.BufferedReader) -> None:
        self._reader = reader

    def makefile(self, mode: str) -> io.BufferedReader:
        return self._reader


class _Connection:
    __slots__ = ("sock", "key", "idle_since")

    def __init__(self, sock: socket.socket, key: _Key) -> None:
        self.sock = sock
        self.key = key
        self.idle_since = 0.0

    def close(self) -> None:
        self.sock.close()

    def still_open(self, now: float, expiry_s: float) -> bool:
        """Idle long enough to be suspect, or readable while idle (the server closed it, or sent
        something nobody asked for): either way it must not carry the next request."""
        if now - self.idle_since > expiry_s:
            return False
        sock = self.sock
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable


def _unfolded(value: str) -> str:
    """A header value continued over several lines (obsolete folding) as one line."""
    return " ".join(value.split()) if "\n" in value else value


@contextmanager
def _socket_errors(
    timeout: type[httpx.TransportError],
    failure: type[httpx.TransportError],
    on_error: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Socket errors as httpx's: ``timeout`` (naming the overall deadline when that is what
    passed) or ``failure``; ``on_error`` (closing the socket) runs first."""
    try:
        yield
    except (TimeoutError, OSError, httpx.TransportError) as exc:
        if on_error is not None:
            on_error()
        if isinstance(exc, httpx.TransportError):
            raise
        if isinstance(exc, TimeoutError):
            left_of_exchange(0.0, timeout)  # raises when the exchange's deadline is what passed
            raise timeout(f"timed out: {exc}"[:300]) from None
        raise failure(f"{type(exc).__name__}: {exc}"[:300]) from None


def _map_read_error(exc: BaseException) -> httpx.TransportError:
    if isinstance(exc, httpx.TransportError):
        return exc
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout("timed out")
    if isinstance(exc, http.client.RemoteDisconnected):
        return httpx.RemoteProtocolError("Server disconnected without sending a response.")
    if isinstance(exc, http.client.IncompleteRead):
        return httpx.RemoteProtocolError(_SHORT_BODY)
    if isinstance(exc, (http.client.HTTPException, ValueError)):
        return httpx.RemoteProtocolError(f"malformed answer: {type(exc).__name__}: {exc}"[:300])
    return httpx.ReadError(f"{type(exc).__name__}: {exc}"[:300])


class _AnswerStream(httpx.SyncByteStream):
    """An answer's body as the socket delivers it; on close the connection is pooled or closed."""

    def __init__(self, transport: Http11Transport, conn: _Connection, answer: http.client.HTTPResponse) -> None:
        self._transport = transport
        self._conn = conn
        self._answer = answer
        self._complete = False
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        answer = self._answer
        while True:
            try:
                chunk = answer.read1(_CHUNK)
            except BaseException as exc:  # noqa: BLE001  (mapped, or re-raised as it was)
                if isinstance(exc, (GeneratorExit, KeyboardInterrupt, SystemExit)):
                    raise
                raise _map_read_error(exc) from None
            if not chunk:
                # read1 ends quietly when the peer closes before Content-Length was reached.
                if answer.length:
                    raise httpx.RemoteProtocolError(_SHORT_BODY)
                self._complete = True
                return
            yield chunk

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        reusable = self._complete and not self._answer.will_close
        self._answer.close()
        if reusable:
            self._transport._release(self._conn)
        else:
            self._conn.close()


class Http11Transport(httpx.BaseTransport):
    """An HTTP/1.1 transport for ``httpx.Client(transport=...)`` (see the module docstring)."""

    bounds_exchanges = True  # guard_transports: every socket wait is already cut to the deadline

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None,
        max_idle: int,
        keepalive_expiry_s: float = 5.0,
    ) -> None:
        if max_idle < 0:
            raise ValueError("max_idle must be >= 0")
        self._ssl_context = ssl_context
        self._max_idle = max_idle
        self._expiry_s = keepalive_expiry_s
        self._idle: dict[_Key, list[_Connection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    # -- the pool ----------------------------------------------------------------------------

    def idle_connections(self) -> int:
        with self._lock:
            return sum(len(conns) for conns in self._idle.values())

    def _checkout(self, key: _Key) -> _Connection | None:
        if not self._max_idle:
            return None
        now = time.monotonic()
        stale: list[_Connection] = []
        found = None
        with self._lock:
            conns = self._idle.get(key)
            while conns:
                conn = conns.pop()
                if conn.still_open(now, self._expiry_s):
                    found = conn
                    break
                stale.append(conn)
        for conn in stale:
            conn.close()
        return found

    def _release(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        with self._lock:
            if not self._closed and self._max_idle:
                conns = self._idle.setdefault(conn.key, [])
                if len(conns) < self._max_idle:
                    conns.append(conn)
                    return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [conn for conns in self._idle.values() for conn in conns]
            self._idle.clear()
        for conn in idle:
            conn.close()

    # -- one exchange ------------------------------------------------------------------------

    def _connect(self, scheme: bytes, host: str, port: int, sni: str | None, timeouts: dict[str, Any]) -> socket.socket:
        connect_timeout = timeouts.get("connect")
        with _socket_errors(httpx.ConnectTimeout, httpx.ConnectError):
            sock = socket.create_connection((host, port), left_of_exchange(connect_timeout, httpx.ConnectTimeout))
        with _socket_errors(httpx.ConnectTimeout, httpx.ConnectError, on_error=sock.close):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == b"https":
                context = self._ssl_context or shared_tls_context()
                sock.settimeout(left_of_exchange(connect_timeout, httpx.ConnectTimeout))
                sock = context.wrap_socket(sock, server_hostname=sni or host)
        return sock

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("the transport is closed")
        url = request.url
        scheme = url.raw_scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"Request URL has an unsupported protocol '{url.scheme}://'.")
        if not url.raw_host:
            raise httpx.UnsupportedProtocol("Request URL is missing a host.")  # as httpcore says it
        head = self._head(request)
        body = request.read()
        if request.headers.get("transfer-encoding", "").lower() == "chunked":
            # httpx asks for chunks only for a body of unknown length; read, it goes as one.
            body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        sni = request.extensions.get("sni_hostname")
        host = url.host
        port = url.port or _DEFAULT_PORTS[scheme]
        key = (scheme, host, port, sni)
        conn = self._checkout(key)
        if conn is None:
            conn = _Connection(self._connect(scheme, host, port, sni, timeouts), key)
        sock = conn.sock
        with _socket_errors(httpx.WriteTimeout, httpx.WriteError, on_error=conn.close):
            sock.settimeout(left_of_exchange(timeouts.get("write"), httpx.WriteTimeout))
            if len(body) < _CHUNK:
                sock.sendall(head + body)  # one write: no small segment waits on a delayed ACK
            else:
                sock.sendall(head)
                sock.sendall(body)
        reader = io.BufferedReader(_Reader(sock, timeouts.get("read")), _CHUNK)
        answer = http.client.HTTPResponse(_AnswerSocket(reader), method=request.method)  # type: ignore[arg-type]
        try:
            answer.begin()
        except BaseException as exc:
            conn.close()
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise _map_read_error(exc) from None
        headers = [(name.encode("latin-1"), _unfolded(value).encode("latin-1")) for name, value in answer.msg.items()]
        return httpx.Response(
            answer.status,
            headers=headers,
            stream=_AnswerStream(self, conn, answer),
            extensions={
                "http_version": b"HTTP/1.1" if answer.version == 11 else b"HTTP/1.0",
                "reason_phrase": answer.reason.encode("latin-1", "replace"),
            },
        )

    @staticmethod
    def _head(request: httpx.Request) -> bytes:
        parts = [request.method.encode("ascii"), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            if not name or _ILLEGAL_IN_HEADER.search(name) or _ILLEGAL_IN_HEADER.search(value):
                raise httpx.LocalProtocolError(f"illegal header {name[:40]!r}")
            parts += (name, b": ", value, b"\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)


__all__ = ["Http11Transport"]
