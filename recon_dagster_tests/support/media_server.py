"""A loopback media server whose answers a test scripts, and the bytes it serves."""

from __future__ import annotations

import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


def pattern_bytes(n: int, offset: int = 0) -> bytes:
    """Deterministic, non-repeating-per-KiB content, so truncation or reordering shows up."""
    block = bytes(range(256)) * 4
    start = offset % len(block)
    out = (block * (n // len(block) + 2))[start : start + n]
    return out


MIB = 1024 * 1024


class MediaHandler(BaseHTTPRequestHandler):
    """Routes: /bytes?n=, /status/<code>, /redirect?to=, /chain?n=, /huge?limit=,
    /declared-huge, /truncated, /echo-headers. Records request paths on the server."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet test output
        return

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        self.server.requests.append(parts.path)  # type: ignore[attr-defined]
        path = parts.path
        if path == "/bytes":
            n = int(query.get("n", "1000"))
            self._send(200, pattern_bytes(n), query.get("type", "application/octet-stream"))
        elif path.startswith("/status/"):
            self._send(int(path.rsplit("/", 1)[1]), b"nope", "text/plain")
        elif path == "/redirect":
            self._redirect(query["to"], int(query.get("code", "302")))
        elif path == "/chain":
            # /chain?n=k answers with exactly k redirects before the body.
            n = int(query["n"])
            self._redirect(f"/chain?n={n - 1}" if n > 1 else "/bytes?n=10")
        elif path == "/huge":
            self._stream_huge(int(query.get("limit", str(64 * MIB))))
        elif path == "/declared-huge":
            self.send_response(200)
            self.send_header("Content-Type", "video/mp4")
            self.send_header("Content-Length", str(10 * 1024 * MIB))
            self.end_headers()
            self.wfile.write(b"x" * 1024)
            self.close_connection = True
        elif path == "/truncated":
            self.send_response(200)
            self.send_header("Content-Type", "video/mp4")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"y" * 40000)
            self.wfile.flush()
            self.close_connection = True
        elif path == "/drip":
            self._drip()
        elif path == "/echo-headers":
            body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
            self._send(200, body, "application/json")
        else:
            self._send(404, b"unknown route", "text/plain")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str, code: int = 302) -> None:
        self.send_response(code)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _drip(self) -> None:
        # One byte every 20 ms, bounded at 10 s: each read succeeds, so only a deadline stops it.
        self.send_response(200)
        self.send_header("Content-Type", "video/mp4")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for _ in range(500):
                self.wfile.write(b"1\r\nd\r\n")
                self.wfile.flush()
                time.sleep(0.02)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def _stream_huge(self, limit: int) -> None:
        # Chunked and without Content-Length, so only the running count can stop the client.
        self.send_response(200)
        self.send_header("Content-Type", "video/mp4")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b"z" * (256 * 1024)
        sent = 0
        try:
            while sent < limit:
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sent += len(chunk)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self.server.huge_sent.append(sent)  # type: ignore[attr-defined]
            self.close_connection = True


class MediaServer:
    """A ThreadingHTTPServer on 127.0.0.1 with a free port, in a daemon thread."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), MediaHandler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.httpd.daemon_threads = True
        self.httpd.requests = []  # type: ignore[attr-defined]
        self.httpd.huge_sent = []  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        # A short poll interval keeps shutdown (and so fixture teardown) quick.
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def url(self, path: str) -> str:
        return f"http://{self.host}{path}"

    @property
    def requests(self) -> list[str]:
        return self.httpd.requests  # type: ignore[attr-defined]

    def __enter__(self) -> MediaServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
