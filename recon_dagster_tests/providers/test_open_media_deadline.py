"""``open_media`` (``ProviderHttp.stream``) waits for the process's request slot only until the
read deadline, as a poll does, and a body cut short is an error (issue 49: it waited on the
semaphore without any deadline, and took a truncated gzip body as a whole, shorter file)."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from recon_dagster.providers.elevenlabs import ElevenLabsResource
from recon_dagster.providers.status import MediaRef, NotSent, NotSentReason, ProviderHTTPError
from recon_dagster.sandbox import SandboxServer, Scenario

pytestmark = pytest.mark.timeout(60)
KEY = "sandbox-key"


@pytest.fixture(scope="module")
def server() -> Iterator[SandboxServer]:
    with SandboxServer(api_key=KEY) as sb:
        yield sb


def test_a_media_stream_with_no_free_slot_is_not_sent_at_its_deadline(server: SandboxServer) -> None:
    task_id = server.add_task("elevenlabs-async", Scenario(polls_before_done=0, media_size=1000))
    res = ElevenLabsResource(
        base_url=server.api_base_url("elevenlabs"), api_key=KEY, max_concurrency=1, read_deadline_s=0.5,
        read_rate_per_s=None, create_rate_per_s=None,
    )  # fmt: skip
    (ref,) = res.poll("elevenlabs-async", task_id).media
    semaphore = res.http._limiter.semaphore
    outcome: list[BaseException | int] = []

    def fetch() -> None:
        try:
            with res.open_media(ref) as response:
                outcome.append(len(response.read()))
        except BaseException as exc:
            outcome.append(exc)

    assert semaphore.acquire(timeout=5)  # the process's one slot is busy with another request
    fetcher = threading.Thread(target=fetch, daemon=True)
    fetcher.start()
    fetcher.join(10)
    semaphore.release()
    fetcher.join(10)
    assert outcome and isinstance(outcome[0], NotSent), f"waited past its deadline for a slot: {outcome}"
    assert outcome[0].reason is NotSentReason.SLOT_WAIT
    # With the slot free, the same stream goes out and reads the whole object.
    with res.open_media(ref) as response:
        assert len(response.read()) == 1000


class _GzipCut(BaseHTTPRequestHandler):
    """Media in gzip, cut before the stream's end (its framing intact: close-delimited)."""

    def do_GET(self) -> None:
        whole = gzip.compress(b"\x00audio" * 5000)
        self.send_response(200)
        self.send_header("Content-Type", "audio/mpeg")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(whole[: len(whole) // 2])

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_media_stream_cut_short_in_gzip_is_an_error_not_a_short_file() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _GzipCut)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        res = ElevenLabsResource(base_url=base, api_key=KEY, read_rate_per_s=None, create_rate_per_s=None)
        ref = MediaRef(url=f"{base}/v1/dubbing/d1/audio/es", kind="audio", needs_auth=True)
        with pytest.raises((ProviderHTTPError, httpx.HTTPError)), res.open_media(ref) as response:
            response.read()
    finally:
        httpd.shutdown()
        httpd.server_close()
