"""``Http11Transport`` over real loopback sockets: the answers the default transport gives, the
same error classes for the retry policy (not sent vs maybe sent), keep-alive that never reuses a
connection it should not, the overall deadline at the socket, and TLS names for pinned hops."""

from __future__ import annotations

import gzip
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from recon_dagster.core.deadlines import exchange_deadline
from recon_dagster.core.http11 import Http11Transport
from recon_dagster.core.httpsend import send_direct
from recon_dagster_tests.support.certs import self_signed

Script = Callable[[socket.socket, bytes], bool]  # (connection, request head) -> keep the connection


def _read_head(conn: socket.socket) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
            while len(rest) < length:
                rest += conn.recv(65536)
    return head + b"\r\n\r\n" + rest


class RawServer:
    """A loopback HTTP/1.1 server whose every answer is written by ``script``; counts connections."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.tls = tls
        self.connections = 0
        self.requests: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            while True:
                head = _read_head(conn)
                if head is None:
                    break
                self.requests.append(head)
                if not self.script(conn, head):
                    break
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def start(script: Script, tls: ssl.SSLContext | None = None) -> RawServer:
        server = RawServer(script, tls)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def _answer(body: bytes, *, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nContent-Type: text/plain\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


def ok(conn: socket.socket, head: bytes) -> bool:
    conn.sendall(_answer(b"hello " + head.split(b" ")[1]))
    return True


def _client(max_idle: int = 4, **kwargs: object) -> httpx.Client:
    return httpx.Client(transport=Http11Transport(ssl_context=None, max_idle=max_idle), **kwargs)  # type: ignore[arg-type]


def _get(client: httpx.Client, url: str, **kwargs: object) -> httpx.Response:
    response = send_direct(client, client.build_request("GET", url, **kwargs))  # type: ignore[arg-type]
    try:
        response.read()
    finally:
        response.close()
    return response


# --- the same answers as the default transport ---------------------------------------------------

SCRIPTS: dict[str, bytes] = {
    "plain": _answer(b"plain body"),
    "repeated headers": _answer(b"x", extra=b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Note: caf\xe9\r\n"),
    "not found": _answer(b"gone", status="404 Not Found"),
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    "gzip": (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
        % (len(gzip.compress(b"unzipped" * 100)), gzip.compress(b"unzipped" * 100))
    ),
    "empty 204": b"HTTP/1.1 204 No Content\r\n\r\n",
    "redirect": b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_answer_is_the_one_the_default_transport_gives(serve: Callable[..., RawServer], name: str) -> None:
    def script(conn: socket.socket, _head: bytes) -> bool:
        conn.sendall(SCRIPTS[name])
        return True

    server = serve(script)
    url = f"http://127.0.0.1:{server.port}/probe?q=a%20b"
    answers = []
    for client in (_client(), httpx.Client()):
        with client:
            response = client.get(url, headers={"x-probe": "p"})
            answers.append(
                (response.status_code, response.headers.multi_items(), response.content, response.reason_phrase)
            )
    assert answers[0] == answers[1]
    # What the server received is the request httpx would send: method, path with the query, headers.
    assert server.requests[0].split(b"\r\n")[0] == b"GET /probe?q=a%20b HTTP/1.1"
    assert b"x-probe: p" in server.requests[0]


def test_a_body_is_sent_with_its_length(serve: Callable[..., RawServer]) -> None:
    server = serve(ok)
    with _client() as client:
        client.post(f"http://127.0.0.1:{server.port}/create", json={"prompt": "a cat"})
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /create HTTP/1.1") and b"content-length: 18" in head.lower()
    assert body == b'{"prompt":"a cat"}'


# --- keep-alive -----------------------------------------------------------------------------------


def test_a_connection_read_to_the_end_is_reused(serve: Callable[..., RawServer]) -> None:
    server = serve(ok)
    with _client() as client:
        for n in range(5):
            assert _get(client, f"http://127.0.0.1:{server.port}/{n}").text == f"hello /{n}"
        assert server.connections == 1
        assert client._transport.idle_connections() == 1  # type: ignore[attr-defined]


def test_without_keepalive_every_request_gets_its_own_connection(serve: Callable[..., RawServer]) -> None:
    server = serve(ok)
    with _client(max_idle=0) as client:
        for n in range(3):
            _get(client, f"http://127.0.0.1:{server.port}/{n}")
        assert server.connections == 3
        assert client._transport.idle_connections() == 0  # type: ignore[attr-defined]


def test_an_answer_closed_before_its_end_does_not_leave_its_connection_pooled(
    serve: Callable[..., RawServer],
) -> None:
    def big(conn: socket.socket, _head: bytes) -> bool:
        conn.sendall(_answer(b"x" * 500_000))
        return True

    server = serve(big)
    with _client() as client:
        response = send_direct(client, client.build_request("GET", f"http://127.0.0.1:{server.port}/"))
        next(response.iter_bytes())  # part of the body, then give up
        response.close()
        assert client._transport.idle_connections() == 0  # type: ignore[attr-defined]
        assert len(_get(client, f"http://127.0.0.1:{server.port}/").content) == 500_000
        assert server.connections == 2


@pytest.mark.parametrize("closing", [b"Connection: close\r\n", b""])
def test_a_connection_the_server_closes_is_never_reused(
    serve: Callable[..., RawServer], closing: bytes
) -> None:
    """Told to close, or closed while idle without a word: the next request opens a new one and
    succeeds (a create sent on a dead pooled connection would come back ambiguous)."""

    def once(conn: socket.socket, _head: bytes) -> bool:
        conn.sendall(_answer(b"one", extra=closing))
        return False  # the server closes after each answer

    server = serve(once)
    with _client() as client:
        for _ in range(3):
            assert _get(client, f"http://127.0.0.1:{server.port}/").text == "one"
            time.sleep(0.05)  # the server's FIN arrives while the connection is idle
        assert server.connections == 3


def test_an_idle_connection_expires(serve: Callable[..., RawServer]) -> None:
    server = serve(ok)
    transport = Http11Transport(ssl_context=None, max_idle=4, keepalive_expiry_s=0.05)
    with httpx.Client(transport=transport) as client:
        _get(client, f"http://127.0.0.1:{server.port}/")
        time.sleep(0.1)
        _get(client, f"http://127.0.0.1:{server.port}/")
    assert server.connections == 2


# --- errors keep their meaning for the retry policy -------------------------------------------------


def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with _client() as client, pytest.raises(httpx.ConnectError):
        _get(client, f"http://127.0.0.1:{port}/")


def test_a_body_shorter_than_its_length_is_a_protocol_error(serve: Callable[..., RawServer]) -> None:
    def short(conn: socket.socket, _head: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..")
        return False

    server = serve(short)
    with _client() as client, pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
        _get(client, f"http://127.0.0.1:{server.port}/")


@pytest.mark.parametrize(
    "answer",
    [b"", b"NOT HTTP AT ALL\r\n\r\n", b"HTTP/1.1 200 OK\r\n" + b"X-Many: y\r\n" * 150 + b"\r\n"],
    ids=["disconnect", "garbage", "too many headers"],
)
def test_a_broken_answer_is_a_protocol_error(serve: Callable[..., RawServer], answer: bytes) -> None:
    def broken(conn: socket.socket, _head: bytes) -> bool:
        conn.sendall(answer)
        return False

    server = serve(broken)
    with _client() as client, pytest.raises(httpx.RemoteProtocolError):
        _get(client, f"http://127.0.0.1:{server.port}/")


@pytest.mark.parametrize("value", ["a\r\nInjected: 1", "a\nb", "a\x00b"])
def test_a_header_that_would_split_the_request_is_refused_before_connecting(
    serve: Callable[..., RawServer], value: str
) -> None:
    server = serve(ok)
    with _client() as client, pytest.raises(httpx.LocalProtocolError):
        _get(client, f"http://127.0.0.1:{server.port}/", headers={"x-bad": value})
    assert server.connections == 0


def test_an_unsupported_scheme_is_refused() -> None:
    with _client() as client, pytest.raises(httpx.UnsupportedProtocol):
        _get(client, "ftp://127.0.0.1/file")


def test_a_silent_server_is_a_read_timeout(serve: Callable[..., RawServer]) -> None:
    def silent(_conn: socket.socket, _head: bytes) -> bool:
        time.sleep(1.0)
        return False

    server = serve(silent)
    with _client(timeout=0.2) as client, pytest.raises(httpx.ReadTimeout):
        _get(client, f"http://127.0.0.1:{server.port}/")


def test_headers_dripped_a_line_at_a_time_end_by_the_overall_deadline(serve: Callable[..., RawServer]) -> None:
    """Every line resets a per-read timeout; the exchange's deadline still ends the wait."""

    def drip(conn: socket.socket, _head: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for n in range(40):
            time.sleep(0.05)
            conn.sendall(b"X-Drip-%d: y\r\n" % n)
        return False

    server = serve(drip)
    started = time.monotonic()
    with (
        _client(timeout=1.0) as client,
        exchange_deadline(started + 0.5, started),
        pytest.raises(httpx.ReadTimeout, match="overall deadline of 0.5 s passed"),
    ):
        _get(client, f"http://127.0.0.1:{server.port}/")
    assert time.monotonic() - started < 1.5  # the drip alone would take 2 s


# --- TLS ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting it) for a certificate naming only ``media.test``."""
    from cryptography import x509

    cert_path, key_path = self_signed(
        Path(tmp_path_factory.mktemp("tls")), "media.test", [x509.DNSName("media.test")]
    )
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_path, key_path)
    return server_ctx, ssl.create_default_context(cafile=str(cert_path))


def test_a_pinned_address_verifies_tls_against_the_name_it_was_given(
    serve: Callable[..., RawServer], tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    server = serve(ok, tls[0])
    transport = Http11Transport(ssl_context=tls[1], max_idle=0)
    with httpx.Client(transport=transport) as client:
        request = client.build_request(
            "GET",
            f"https://127.0.0.1:{server.port}/pinned",
            headers={"host": f"media.test:{server.port}"},
            extensions={"sni_hostname": "media.test"},
        )
        response = send_direct(client, request)
        assert response.read() == b"hello /pinned"
        response.close()
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
            _get(client, f"https://127.0.0.1:{server.port}/", extensions={"sni_hostname": "other.test"})
        with pytest.raises(httpx.ConnectError):  # no name given: the address is not on the certificate
            _get(client, f"https://127.0.0.1:{server.port}/")


def test_a_connection_the_server_asked_to_close_is_not_reused_even_while_it_stays_open(
    serve: Callable[..., RawServer],
) -> None:
    def says_close(conn: socket.socket, _head: bytes) -> bool:
        conn.sendall(_answer(b"bye", extra=b"Connection: close\r\n"))
        return True  # says close, yet keeps reading: the client must not take it at its socket

    server = serve(says_close)
    with _client() as client:
        for _ in range(2):
            assert _get(client, f"http://127.0.0.1:{server.port}/").text == "bye"
        assert server.connections == 2
