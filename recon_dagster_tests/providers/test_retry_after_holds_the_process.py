"""With per-process limits (``RECON_LIMITS=process``) a provider's Retry-After holds back every
request of the process to that account, not only the one that heard it (issue 49: the other
threads kept sending into the throttle)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from recon_dagster.providers.http import HttpSettings, Limits, ProviderHttp
from recon_dagster.providers.status import NotSent, NotSentReason

pytestmark = pytest.mark.timeout(60)
RETRY_AFTER_S = 2


class _Throttling(BaseHTTPRequestHandler):
    """Answers the first request 429 with a Retry-After, every later one 200; keeps arrival times."""

    arrivals: list[tuple[str, float]]
    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            first = not self.arrivals
            self.arrivals.append((self.path, time.monotonic()))
        body = b'{"error": "slow down"}' if first else b"{}"
        self.send_response(429 if first else 200)
        if first:
            self.send_header("Retry-After", str(RETRY_AFTER_S))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list[tuple[str, float]]]]:
    arrivals: list[tuple[str, float]] = []
    handler = type("Handler", (_Throttling,), {"arrivals": arrivals})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", arrivals
    finally:
        httpd.shutdown()
        httpd.server_close()


def _client(base_url: str, deadline_s: float = 20.0, heard: threading.Event | None = None) -> ProviderHttp:
    # Its own Limits value: a process-wide limiter of its own (the limiters are keyed by it).
    limits = Limits(max_concurrency=7, read_rate_per_s=None)
    settings = HttpSettings(read_deadline_s=deadline_s, limits=limits, account=None, backoff_initial_s=0.01)

    def sleep(seconds: float) -> None:  # the retry's sleep: the 429 has been read by then
        if heard is not None:
            heard.set()
        time.sleep(seconds)

    return ProviderHttp("kie", base_url, {}, "secret-x", settings, error_message=lambda r: None, sleep=sleep)


def test_a_retry_after_holds_the_other_threads_of_the_process(server) -> None:
    base_url, arrivals = server
    read = threading.Event()
    heard = _client(base_url, heard=read)
    other = _client(base_url)  # another resource copy of the same account in the same process
    first = threading.Thread(
        target=lambda: heard.request("GET", "/first", label="kie-standard", idempotent=True)
    )
    first.start()
    assert read.wait(20)
    throttled_at = arrivals[0][1]
    other.request("GET", "/second", label="kie-standard", idempotent=True)
    first.join(30)
    second_at = next(t for path, t in arrivals if path == "/second")
    assert second_at - throttled_at >= RETRY_AFTER_S - 0.2, "sent into the provider's Retry-After"


def test_a_request_whose_deadline_ends_inside_the_block_is_not_sent(server) -> None:
    base_url, arrivals = server
    read = threading.Event()
    heard = _client(base_url, heard=read)
    first = threading.Thread(
        target=lambda: heard.request("GET", "/first", label="kie-standard", idempotent=True)
    )
    first.start()
    assert read.wait(20)
    with pytest.raises(NotSent) as refused:
        _client(base_url, deadline_s=0.5).request("GET", "/late", label="kie-standard", idempotent=True)
    assert refused.value.reason is NotSentReason.LIMITER_REFUSED and refused.value.retry_in_s is not None
    first.join(30)
    assert "/late" not in [path for path, _ in arrivals]
