"""One overall deadline per exchange, headers included.

A host that sends its response headers one line per second resets every per-read timeout; the
poll (``RECON_POLL_DEADLINE_S``) and the media download (``RECON_MEDIA_DEADLINE_S``) must still
end at their deadline, close the socket, and say how long they waited. The server is a raw socket
server in the test (``drip_support``), over real loopback TCP.
"""

from __future__ import annotations

import re
import time

import pytest

from recon_dagster.media.errors import MediaFetchError
from recon_dagster.media.transfer import fetch_bytes
from recon_dagster.providers import ProviderHTTPError, providers_from_env
from recon_dagster_tests.support.drip import drip_server, wait_closed

pytestmark = pytest.mark.timeout(60)

SLACK_S = 2.0


def _waited(message: str) -> float:
    found = re.search(r"waited (\d+(?:\.\d+)?) s", message)
    assert found, f"the error does not say how long it waited: {message}"
    return float(found.group(1))


@pytest.mark.parametrize(
    ("kind", "base_env"),
    [("kie-standard", "KIE_BASE_URL"), ("replicate-prediction", "REPLICATE_BASE_URL")],
)
@pytest.mark.slow
def test_a_poll_whose_headers_drip_ends_at_its_deadline_and_closes_the_socket(monkeypatch, kind, base_env):
    deadline = 3.0
    with drip_server(interval_s=0.5) as server:
        monkeypatch.setenv(base_env, server.url)
        monkeypatch.setenv("KIE_API_KEY", "k")
        monkeypatch.setenv("REPLICATE_API_TOKEN", "k")
        monkeypatch.setenv("RECON_LIMITS", "process")
        monkeypatch.setenv("RECON_POLL_DEADLINE_S", str(deadline))
        providers = providers_from_env()
        started = time.monotonic()
        with pytest.raises(ProviderHTTPError) as caught:
            providers.poll(kind, "task-1")
        elapsed = time.monotonic() - started
        providers.close()

        assert elapsed < deadline + SLACK_S, f"took {elapsed:.1f} s"
        assert deadline - 0.5 <= _waited(str(caught.value)) < deadline + SLACK_S
        # Every connection it opened was closed by the client, none left dripping.
        assert wait_closed(server, server.accepted)
        assert max(server.closed_after_s) < deadline + SLACK_S


@pytest.mark.slow
def test_a_media_download_whose_headers_drip_ends_at_its_deadline_and_closes_the_socket():
    deadline = 3.0
    with drip_server(interval_s=0.5) as server:
        started = time.monotonic()
        with pytest.raises(MediaFetchError) as caught:
            fetch_bytes(
                f"{server.url}/image.png",
                max_bytes=1 << 20,
                allowed_hosts=[f"127.0.0.1:{server.port}"],
                deadline_s=deadline,
            )
        elapsed = time.monotonic() - started

        assert elapsed < deadline + SLACK_S, f"took {elapsed:.1f} s"
        assert deadline - 0.5 <= _waited(str(caught.value)) < deadline + SLACK_S
        assert wait_closed(server, 1)
        assert server.closed_after_s[0] < deadline + SLACK_S
