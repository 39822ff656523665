"""A compressed answer that stops before its end is refused as a protocol error.

zlib reports no error for a gzip or deflate stream that merely stops: the body decodes to a
prefix (often the whole JSON: the trailer with the CRC and length is all that is missing), and
only the stream's end shows the answer is whole. Framing cannot show it either when the answer is
close-delimited, or when what cut it (a proxy, a gateway) also set a Content-Length for what it
sent. Here a front on loopback relays the sandbox's gzip answers and cuts their end, framed both
ways. On main at 4786a20 the answers cut inside the trailer were accepted as a finished task.
"""

from __future__ import annotations

import http.client
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest

from recon_dagster.providers import AmbiguousCreateError, ProviderHTTPError, providers_from_env
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.payloads import PAYLOADS

pytestmark = pytest.mark.timeout(60)

KINDS = {
    "kie-standard": "KIE_BASE_URL",
    "replicate-prediction": "REPLICATE_BASE_URL",
    "elevenlabs-async": "ELEVENLABS_BASE_URL",
}


class _CutHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _CuttingFront

    def log_message(self, format: str, *args: object) -> None:
        return

    def _relay(self) -> None:
        front = self.server
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        upstream = http.client.HTTPConnection("127.0.0.1", front.upstream_port, timeout=30)
        upstream.request(self.command, self.path, body, headers)
        answer = upstream.getresponse()
        raw = answer.read()
        upstream.close()
        if (answer.getheader("Content-Encoding") or "").lower() == "gzip":
            raw = zlib.decompress(raw, 31)
        # Compressed here, as a CDN or gateway in front of a provider does, then cut.
        encoding = front.encoding
        raw = zlib.compress(raw, 6, 31 if encoding == "gzip" else 15)
        if front.cut:
            front.cut_answers += 1
            raw = raw[: -front.cut] if front.cut > 0 else raw[: len(raw) // 2]
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("content-length", "content-encoding", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Encoding", encoding)
        if front.close_delimited:
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = _relay


class _CuttingFront(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream_port: int, cut: int, encoding: str, close_delimited: bool) -> None:
        self.upstream_port = upstream_port
        self.cut = cut  # bytes cut off the end; -1: half the body
        self.encoding = encoding
        self.close_delimited = close_delimited
        self.cut_answers = 0
        super().__init__(("127.0.0.1", 0), _CutHandler)


@pytest.fixture
def front_for(sandbox: SandboxServer, monkeypatch: pytest.MonkeyPatch) -> Iterator:  # type: ignore[type-arg]
    fronts: list[_CuttingFront] = []

    def start(kind: str, cut: int, encoding: str = "gzip", close_delimited: bool = False) -> _CuttingFront:
        front = _CuttingFront(sandbox.port, cut, encoding, close_delimited)
        Thread(target=front.serve_forever, args=(0.05,), daemon=True).start()
        fronts.append(front)
        base = dict(sandbox.env())[KINDS[kind]]
        monkeypatch.setenv(KINDS[kind], base.replace(str(sandbox.port), str(front.server_address[1])))
        return front

    monkeypatch.setenv("RECON_LIMITS", "process")
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "5")
    yield start
    for front in fronts:
        front.shutdown()
        front.server_close()


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize(
    ("cut", "encoding", "close_delimited"),
    [
        (8, "gzip", False),  # the whole trailer (CRC and length): the JSON itself is complete
        (4, "gzip", True),  # half the trailer, close-delimited
        (1, "gzip", False),
        (4, "deflate", False),  # the Adler-32 checksum
        (-1, "gzip", True),  # half the body
    ],
    ids=[
        "gzip-trailer",
        "gzip-half-trailer-close",
        "gzip-last-byte",
        "deflate-checksum",
        "gzip-half-body-close",
    ],
)
def test_a_poll_answer_cut_before_its_end_is_refused_as_a_protocol_error(
    sandbox, front_for, kind, cut, encoding, close_delimited
):
    front = front_for(kind, cut, encoding, close_delimited)
    task = sandbox.add_task(kind, Scenario(polls_before_done=0))
    providers = providers_from_env()
    kie_like = getattr(providers, kind.split("-", 1)[0]).model_copy(
        update={"max_attempts": 2, "backoff_initial_s": 0.01}
    )
    try:
        with pytest.raises(ProviderHTTPError, match="RemoteProtocolError.*truncated"):
            kie_like.poll(kind, task)
    finally:
        providers.close()
    # A poll is idempotent: the cut answer was asked for again, and refused again.
    assert front.cut_answers == 2 and sandbox.poll_count(task) == 2


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("close_delimited", [False, True])
def test_the_same_answers_whole_are_read_as_before(sandbox, front_for, encoding, close_delimited):
    front_for("kie-standard", 0, encoding, close_delimited)
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    providers = providers_from_env()
    try:
        assert providers.poll("kie-standard", task).state.value == "succeeded"
    finally:
        providers.close()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_create_answer_cut_before_its_end_is_ambiguous_and_not_resent(sandbox, front_for, kind):
    """The create reached the provider; what came back cannot be trusted, and is not sent again
    (a second task would bill twice)."""
    front = front_for(kind, cut=8)
    providers = providers_from_env()
    try:
        with pytest.raises(AmbiguousCreateError, match="truncated"):
            providers.create(kind, PAYLOADS[kind])
    finally:
        providers.close()
    assert front.cut_answers == 1 and sandbox.create_count(kind) == 1
