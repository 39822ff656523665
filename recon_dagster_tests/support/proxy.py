"""Egress machinery for tests: a forward proxy and a TLS front on loopback (test tools only).

``ForwardProxy`` is an HTTP forward proxy of the kind a cluster's egress goes through: plain
``http`` requests arrive in absolute form (``GET http://host:port/path``) and are forwarded,
``CONNECT host:port`` opens a tunnel (the proxy resolves the name itself) and relays bytes both
ways. It records every request it saw as ``(method, target)``, and can refuse chosen tunnels the
way a proxy's access rules do.

``TlsFront`` terminates TLS on loopback in front of a plain server (the provider sandbox), so the
same sandbox can be reached over ``https`` with a certificate the test trusts.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509

from recon_dagster_tests.support.certs import self_signed

# Headers of one hop only, never forwarded (RFC 9110 7.6.1), plus the ones rewritten here.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)


def _pump(source: socket.socket, sink: socket.socket, done: threading.Event) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends or fails."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        done.set()


def relay(a: socket.socket, b: socket.socket) -> None:
    """Relay bytes between two connected sockets until either side ends, then close both (no
    half-close: a TLS socket cannot shut down one direction and keep reading the other)."""
    done = threading.Event()
    threading.Thread(target=_pump, args=(b, a, done), daemon=True).start()
    threading.Thread(target=_pump, args=(a, b, done), daemon=True).start()
    done.wait()
    for sock in (a, b):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def log_message(self, format: str, *args: object) -> None:
        return

    def _authorized(self) -> bool:
        """True when no credentials are required or the request carries them; else answers 407."""
        expected = self.server.credentials
        if expected is None:
            return True
        token = base64.b64encode(f"{expected[0]}:{expected[1]}".encode()).decode()
        if self.headers.get("Proxy-Authorization") == f"Basic {token}":
            return True
        self.send_response(407, "Proxy Authentication Required")
        self.send_header("Proxy-Authenticate", 'Basic realm="egress"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def do_CONNECT(self) -> None:
        self.server.record("CONNECT", self.path)
        if not self._authorized():
            return
        host, _, port = self.path.rpartition(":")
        if self.server.refuse(host.strip("[]")):
            self.send_response(403, "Forbidden by the proxy's rules")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        try:
            upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
        except OSError:
            self.send_response(502, "Bad Gateway")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        upstream.settimeout(None)
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        relay(self.connection, upstream)

    def _forward(self) -> None:
        self.server.record(self.command, self.path)
        if not self._authorized():
            return
        target = urlsplit(self.path)
        if target.scheme != "http" or not target.hostname:
            self.send_response(400, "Absolute http URL expected")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        upstream = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=30)
        try:
            path = target.path or "/"
            upstream.request(self.command, f"{path}?{target.query}" if target.query else path, body, headers)
            answer = upstream.getresponse()
            payload = answer.read()
        except (OSError, http.client.HTTPException):
            self.send_response(502, "Bad Gateway")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        finally:
            upstream.close()
        self.send_response(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, refuse: Callable[[str], bool], credentials: tuple[str, str] | None) -> None:
        self.seen: list[tuple[str, str]] = []
        self.refuse = refuse
        self.credentials = credentials
        self._lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)

    def record(self, method: str, target: str) -> None:
        with self._lock:
            self.seen.append((method, target))


class ForwardProxy:
    """A forward proxy on a free loopback port; ``seen`` lists every request it received. With
    ``credentials`` (user, password) it answers 407 to a request without them."""

    def __init__(
        self, refuse: Callable[[str], bool] = lambda _host: False, credentials: tuple[str, str] | None = None
    ) -> None:
        self._server = _ProxyServer(refuse, credentials)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def seen(self) -> list[tuple[str, str]]:
        return list(self._server.seen)

    def __enter__(self) -> ForwardProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class TlsFront:
    """TLS on a free loopback port, relayed as plain TCP to ``127.0.0.1:upstream_port``; its
    certificate names ``localhost`` and ``127.0.0.1``, and ``ca_file`` is the file to trust."""

    def __init__(self, upstream_port: int, folder: Path) -> None:
        self.ca_file, key = self_signed(
            folder,
            "recon proxy test CA",
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        )
        self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._tls.load_cert_chain(self.ca_file, key)
        self._upstream = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            secure = self._tls.wrap_socket(conn, server_side=True)
            secure.settimeout(None)
            upstream = socket.create_connection(("127.0.0.1", self._upstream), timeout=10)
            upstream.settimeout(None)
        except (OSError, ssl.SSLError):
            conn.close()
            return
        relay(secure, upstream)

    def __enter__(self) -> TlsFront:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._listener.close()


@contextlib.contextmanager
def forward_proxy(
    refuse: Callable[[str], bool] = lambda _host: False, credentials: tuple[str, str] | None = None
) -> Iterator[ForwardProxy]:
    with ForwardProxy(refuse, credentials) as proxy:
        yield proxy
