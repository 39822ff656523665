"""The provider sandbox's socket plumbing: a threaded HTTP/1.1 server around ``app.Sandbox``.

``SandboxServer`` is what tests and ``serve_forever`` start; the request answering lives in
``app`` (routing table), ``routes/`` (one module per provider) and ``admin`` (``/_sandbox``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from recon_dagster.config import Settings
from recon_dagster.core.kinds import get_kind
from recon_dagster.sandbox import plugins
from recon_dagster.sandbox.app import Sandbox
from recon_dagster.sandbox.scenario import Scenario
from recon_dagster.sandbox.wire import Request, Response, json_response

MAX_BODY = 64 * 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "recon-sandbox"
    sys_version = ""
    # Headers and body go out in one write, but keep small replies from waiting on Nagle.
    disable_nagle_algorithm = True
    timeout = 300
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        # Silent on purpose: request lines and headers are never logged (keys travel in headers).
        return

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _read_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            total = 0
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                total += size
                if total > MAX_BODY:
                    return None
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return None
        return self.rfile.read(length) if length else b""

    def _serve(self) -> None:
        sandbox = self.server.sandbox
        try:
            body = self._read_body()
        except ValueError:
            self._write(json_response(400, {"error": "malformed request body framing"}))
            self.close_connection = True
            return
        if body is None:
            self._write(json_response(413, {"error": f"request body larger than {MAX_BODY} bytes"}))
            self.close_connection = True
            return
        parts = urlsplit(self.path)
        req = Request(self.command, parts.path, parse_qs(parts.query), self.headers, body)
        response = sandbox.handle(req)
        if response.delay_s > 0:
            sandbox.release.wait(response.delay_s)
        if response.drop:
            self.close_connection = True
            return
        self._write(response)

    def _write(self, response: Response) -> None:
        head = [f"HTTP/1.1 {response.status} {self.responses.get(response.status, ('',))[0]}"]
        headers = {"Content-Type": response.content_type, **response.headers}
        chunked = False
        if isinstance(response.body, bytes | bytearray):
            headers["Content-Length"] = str(len(response.body))
        elif response.length is not None:
            headers["Content-Length"] = str(response.length)
        else:
            headers["Transfer-Encoding"] = "chunked"
            chunked = True
        headers["Date"] = self.date_time_string()
        head.extend(f"{k}: {v}" for k, v in headers.items())
        head_bytes = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        try:
            if isinstance(response.body, bytes | bytearray):
                payload = b"" if self.command == "HEAD" else bytes(response.body)
                self.wfile.write(head_bytes + payload)
                return
            self.wfile.write(head_bytes)
            for chunk in response.body:
                if chunked:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                else:
                    self.wfile.write(chunk)
            if chunked and self.command != "HEAD":
                self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)

    def track(self, conn: socket.socket, open_: bool) -> None:
        with self._conns_lock:
            if open_:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def close_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class SandboxServer:
    """A provider sandbox on loopback; start it, point clients at ``env()``, steer with scenarios.

    Use as a context manager, or ``start()``/``stop()``. Other processes steer it through the
    admin HTTP API under ``{base_url}/_sandbox/``.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, api_key: str = "sandbox-key", latency_s: float = 0.0
    ) -> None:
        if not api_key:
            raise ValueError("api_key must be a non-empty string")
        self.host = host
        self.port = port
        self.sandbox = Sandbox(api_key, latency_s)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        # The key is deliberately absent.
        return f"SandboxServer(base_url={self.base_url!r})"

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> SandboxServer:
        """Bind and serve in a background thread; returns self."""
        if self._httpd is not None:
            return self
        if self.sandbox.release.is_set():  # stopped before: held calls must hold again
            self.sandbox.release = threading.Event()
        try:
            self._httpd = _HTTPServer((self.host, self.port), self.sandbox)
        except OSError as exc:
            raise OSError(
                exc.errno, f"the sandbox cannot listen on {self.host}:{self.port}: {exc.strerror}"
            ) from None
        self.port = self._httpd.server_address[1]
        self.sandbox.base_url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"sandbox-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end calls held open, close client connections."""
        if self._httpd is None:
            return
        self.sandbox.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> SandboxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait(self) -> None:
        """Block until the server stops (used by ``serve_forever``)."""
        if self._thread is not None:
            self._thread.join()

    # -- addresses ----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the sandbox is not started: call start() or use it as a context manager")
        return self.sandbox.base_url

    def api_base_url(self, provider: str) -> str:
        """A registered provider's API root on the sandbox (``/<provider>`` plus its plugin's
        ``base_path``), what its clients take as their base URL: ``server.api_base_url("fal")``.
        A method, not an attribute per provider: mypy checks every call (a ``KeyError`` names an
        unregistered provider)."""
        plugin = plugins.plugins().get(provider)
        if plugin is None:
            raise KeyError(f"{provider!r} is not a registered provider with a sandbox")
        return self.provider_base_url(provider) + plugin.base_path

    @property
    def admin_url(self) -> str:
        return f"{self.base_url}/_sandbox"

    def env(self) -> dict[str, str]:
        """Environment for clients (base URLs, keys, and the media host allow-list)."""
        key = self.sandbox.api_key
        return {
            **{
                var: value
                for name, plugin in plugins.plugins().items()
                for var, value in plugin.env(self.provider_base_url(name), key).items()
            },
            Settings.media_allowed_hosts.name: f"{self.host}:{self.port}",
        }

    def provider_base_url(self, provider: str) -> str:
        """Where a plugin provider's routes are served (``/<provider>`` on the sandbox)."""
        return f"{self.base_url}/{provider}"

    # -- steering -----------------------------------------------------------------------------

    def add_task(self, kind: str, scenario: Scenario | None = None, task_id: str | None = None) -> str:
        """Seed an upstream task as if a (now dead) worker had created it; returns its id."""
        return self.sandbox.state.add_task(kind, scenario, task_id).task_id

    def set_default_scenario(self, kind: str, scenario: Scenario | None) -> None:
        """Scenario for creates/calls of ``kind`` that carry none (None: plain success)."""
        get_kind(kind)
        self.sandbox.state.set_default(kind, scenario)

    def reset(self) -> None:
        """Forget all tasks, default scenarios and counters."""
        self.sandbox.reset()

    def media_url(self, task_id: str, n: int = 0) -> str:
        """URL of media object ``n`` of a task (for dubbing: the audio endpoint)."""
        task = self.sandbox.state.get(task_id)
        if task is None:
            raise KeyError(f"no sandbox task {task_id!r}")
        urls = self.sandbox.media_urls(task)
        if not 0 <= n < len(urls):
            raise IndexError(f"task {task_id!r} has {len(urls)} media object(s), asked for #{n}")
        return urls[n]

    def task_info(self, task_id: str) -> dict[str, Any]:
        """What the sandbox knows of a task (kind, scenario, request counts)."""
        task = self.sandbox.state.get(task_id)
        if task is None:
            raise KeyError(f"no sandbox task {task_id!r}")
        return task.info()

    # -- counters -----------------------------------------------------------------------------

    def create_count(self, kind: str | None = None) -> int:
        """Creates that made an upstream task or a billable sync call (all kinds if None)."""
        if kind is not None:
            get_kind(kind)
        return self.sandbox.state.create_count(kind)

    def creates_for(self, task_id: str) -> int:
        """Creates that produced ``task_id``, or whose request body contains that string.

        Pass a job id your create bodies carry (callBackUrl, metadata) to count creates per job.
        """
        return self.sandbox.state.creates_for(task_id)

    def poll_count(self, task_id: str) -> int:
        """Poll requests for this id, including throttled ones and polls of unknown ids."""
        return self.sandbox.state.polls.get(task_id, 0)

    def requests_total(self) -> int:
        """Provider and media requests served (admin calls excluded)."""
        return self.sandbox.state.requests_total

    def request_times(self, provider: str | None = None, op: str | None = None) -> list[float]:
        """Unix times of the provider API requests of ``provider`` and ``op`` (read, create)."""
        return self.sandbox.state.request_times(provider, op)

    def media_downloads(self, task_id: str) -> int:
        """GET requests for this task's media (refused ones included)."""
        return self.sandbox.state.media.get(task_id, 0)

    def stats(self) -> dict[str, Any]:
        """All counters, as the admin ``GET stats`` returns them."""
        return self.sandbox.state.stats()


__all__ = ["Sandbox", "SandboxServer"]
