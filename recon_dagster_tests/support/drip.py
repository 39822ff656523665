"""A loopback HTTP server that drips its response headers one line at a time, for deadline tests.

A raw socket server (not ``http.server``): it answers every request with a status line and then
one header line every ``interval_s`` seconds, never ending the header block, and records for each
connection how long it stayed open (until the client closed it, or a write failed).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class DripServer:
    port: int
    interval_s: float
    # Seconds each connection stayed open, in the order they closed.
    closed_after_s: list[float] = field(default_factory=list)
    accepted: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _serve_one(server: DripServer, conn: socket.socket, stop: threading.Event) -> None:
    opened = time.monotonic()
    conn.settimeout(0.2)
    try:
        request = b""
        while b"\r\n\r\n" not in request and not stop.is_set():
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return
            request += chunk
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        n = 0
        while not stop.is_set():
            # Wait out the interval, noticing a close by the client as soon as it happens.
            until = time.monotonic() + server.interval_s
            while time.monotonic() < until:
                try:
                    if conn.recv(1) == b"":
                        return
                except TimeoutError:
                    pass
            n += 1
            conn.sendall(f"X-Drip-{n}: {'a' * 8}\r\n".encode())
    except OSError:
        return
    finally:
        server.closed_after_s.append(time.monotonic() - opened)
        conn.close()


@contextmanager
def drip_server(interval_s: float = 1.0) -> Iterator[DripServer]:
    """Serve on a free loopback port until the block ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    server = DripServer(listener.getsockname()[1], interval_s)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server.accepted += 1
            threading.Thread(target=_serve_one, args=(server, conn, stop), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def wait_closed(server: DripServer, count: int, timeout_s: float = 5.0) -> bool:
    """Whether ``count`` connections have closed within ``timeout_s``."""
    until = time.monotonic() + timeout_s
    while len(server.closed_after_s) < count and time.monotonic() < until:
        time.sleep(0.05)
    return len(server.closed_after_s) >= count
