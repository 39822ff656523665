"""``send_direct`` answers what ``Client.send(stream=True, follow_redirects=False)`` answers, over a
real loopback server, with less of the client's machinery in between (no cookie extraction); it
refuses a client whose auth or hooks it would skip."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from recon_dagster.core.httpsend import send_direct


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = f"{self.path} {self.headers.get('x-probe')}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Set-Cookie", "session=abc; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _answer(response: httpx.Response) -> tuple[int, bytes, str | None, str | None]:
    try:
        return (
            response.status_code,
            response.read(),
            response.headers.get("location"),
            str(response.request.url),
        )
    finally:
        response.close()


@pytest.mark.parametrize("path", ["/poll?taskId=t-1", "/redirect/1"])
def test_the_answer_is_the_one_client_send_gives(base_url: str, path: str) -> None:
    with httpx.Client(base_url=base_url, follow_redirects=False) as client:
        sent = client.build_request("GET", path, headers={"x-probe": "p"})
        expected = _answer(
            client.send(client.build_request("GET", path, headers={"x-probe": "p"}), stream=True)
        )
        assert _answer(send_direct(client, sent)) == expected
        assert expected[0] in (200, 302)  # a redirect comes back as it is, never followed


def test_the_connection_is_reused_once_the_answer_is_read(base_url: str) -> None:
    with httpx.Client(base_url=base_url) as client:
        for _ in range(5):
            _answer(send_direct(client, client.build_request("GET", "/poll")))
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert len(pool.connections) == 1  # returned to the pool, not leaked


def test_cookies_are_not_extracted(base_url: str) -> None:
    with httpx.Client(base_url=base_url) as client:
        _answer(send_direct(client, client.build_request("GET", "/poll")))
        assert len(client.cookies) == 0  # Client.send would have stored session=abc


def test_a_mounted_transport_still_routes_the_request() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(204)

    with httpx.Client(mounts={"http://mounted.test": httpx.MockTransport(handler)}) as client:
        response = send_direct(client, client.build_request("GET", "http://mounted.test/x"))
        assert response.status_code == 204 and seen == ["http://mounted.test/x"]


def test_a_closed_client_refuses() -> None:
    client = httpx.Client()
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        send_direct(client, httpx.Request("GET", "http://127.0.0.1:9/"))


@pytest.mark.parametrize(
    "client_kwargs",
    [{"auth": ("user", "secret")}, {"event_hooks": {"request": [lambda request: None]}}],
    ids=["auth", "event hooks"],
)
def test_a_client_whose_extras_would_be_skipped_is_refused(client_kwargs: dict) -> None:
    with httpx.Client(**client_kwargs) as client, pytest.raises(ValueError, match="auth or event hooks"):
        send_direct(client, httpx.Request("GET", "http://127.0.0.1:9/"))
