"""Name resolution ends by the exchange's deadline, for provider calls and media.

``socket.getaddrinfo`` takes no timeout, and httpx's transport resolves inside its connect: a
resolver that does not answer held a poll, a create or a media download for as long as the system
resolver retried. Here ``socket.getaddrinfo`` is replaced by one that hangs (for 30 s, or until the
test ends) for every name under ``hang.test``, and answers the rest as before. On main at 4786a20
every case here waited out the hung resolver.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from recon_dagster.core import dns
from recon_dagster.media.errors import MediaFetchError
from recon_dagster.media.transfer import fetch_bytes
from recon_dagster.providers import AmbiguousCreateError, ProviderHTTPError, providers_from_env
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.payloads import PAYLOADS

pytestmark = pytest.mark.timeout(60)

HANG_S = 30.0
SLACK_S = 3.0


@pytest.fixture
def hung_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """``socket.getaddrinfo`` hangs for names under ``hang.test``; yields the names it was asked."""
    real = socket.getaddrinfo
    released = threading.Event()
    asked: list[str] = []

    def hanging(host, *args, **kwargs):
        if isinstance(host, str) and host.endswith("hang.test"):
            asked.append(host)
            released.wait(HANG_S)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    monkeypatch.setenv("RECON_LIMITS", "process")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    try:
        yield asked
    finally:
        released.set()  # the lookups still running in the resolver's workers end now


def _hung_base(sandbox, monkeypatch, variable: str, host: str) -> None:
    base = sandbox.env()[variable]
    monkeypatch.setenv(variable, base.replace("127.0.0.1", host))


@pytest.mark.parametrize(
    ("kind", "variable"),
    [("kie-standard", "KIE_BASE_URL"), ("replicate-prediction", "REPLICATE_BASE_URL")],
)
@pytest.mark.slow
def test_a_poll_whose_provider_name_never_resolves_ends_at_the_poll_deadline(
    sandbox, hung_resolver, monkeypatch, kind, variable
):
    deadline = 2.0
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", str(deadline))
    _hung_base(sandbox, monkeypatch, variable, "api.hang.test")
    task = sandbox.add_task(kind, Scenario(polls_before_done=0))
    providers = providers_from_env()
    started = time.monotonic()
    try:
        with pytest.raises(ProviderHTTPError, match="deadline"):
            providers.poll(kind, task)
    finally:
        providers.close()
    assert time.monotonic() - started < deadline + SLACK_S
    assert hung_resolver and sandbox.poll_count(task) == 0


@pytest.mark.slow
def test_a_create_whose_provider_name_never_resolves_ends_at_its_connect_timeout(
    sandbox, hung_resolver, monkeypatch
):
    """A create has no overall deadline (an answer may take minutes), but resolving the name is
    part of connecting: it ends at the connect timeout, and since nothing was sent it is an
    ordinary failure, retried, never 'may have been billed'."""
    _hung_base(sandbox, monkeypatch, "KIE_BASE_URL", "api.hang.test")
    providers = providers_from_env()
    kie = providers.kie.model_copy(
        update={"connect_timeout_s": 1.0, "max_attempts": 2, "backoff_initial_s": 0.01}
    )
    started = time.monotonic()
    try:
        with pytest.raises(ProviderHTTPError, match="ConnectTimeout") as caught:
            kie.create("kie-standard", PAYLOADS["kie-standard"])
    finally:
        providers.close()
    assert not isinstance(caught.value, AmbiguousCreateError)
    assert time.monotonic() - started < 2 * 1.0 + SLACK_S
    assert len(hung_resolver) == 2 and sandbox.create_count("kie-standard") == 0


@pytest.mark.slow
def test_a_poll_through_a_proxy_whose_name_never_resolves_ends_at_the_poll_deadline(
    sandbox, hung_resolver, monkeypatch
):
    deadline = 2.0
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", str(deadline))
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.hang.test:3128")
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    providers = providers_from_env()
    started = time.monotonic()
    try:
        with pytest.raises(ProviderHTTPError, match="deadline"):
            providers.poll("kie-standard", task)
    finally:
        providers.close()
    assert time.monotonic() - started < deadline + SLACK_S
    assert "proxy.hang.test" in hung_resolver


@pytest.mark.slow
def test_a_media_host_checked_by_the_guard_that_never_resolves_ends_at_the_media_deadline(hung_resolver):
    deadline = 2.0
    started = time.monotonic()
    with pytest.raises(MediaFetchError, match="cannot resolve host: ResolveTimeout"):
        fetch_bytes(
            "https://cdn.hang.test/image.png", max_bytes=1 << 20, allowed_hosts=(), deadline_s=deadline
        )
    assert time.monotonic() - started < deadline + SLACK_S


@pytest.mark.slow
def test_an_allowed_media_host_that_never_resolves_ends_at_the_media_deadline(sandbox, hung_resolver):
    """A listed host is resolved at connect time, inside httpx's transport: cut there too."""
    deadline = 2.0
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0, media_kind="image"))
    url = sandbox.media_url(task).replace("127.0.0.1", "media.hang.test")
    started = time.monotonic()
    with pytest.raises(MediaFetchError, match="request failed: ConnectTimeout"):
        fetch_bytes(
            url, max_bytes=1 << 20, allowed_hosts=[f"media.hang.test:{sandbox.port}"], deadline_s=deadline
        )
    assert time.monotonic() - started < deadline + SLACK_S
    assert hung_resolver == ["media.hang.test"]


def test_a_hung_resolver_holds_at_most_the_resolver_pool_and_names_that_resolve_still_do(hung_resolver):
    """Lookups that time out leave their workers behind until the resolver answers; the pool is
    bounded, and an address is never looked up at all."""
    for n in range(dns.WORKERS + 4):
        with pytest.raises(dns.ResolveTimeout):
            dns.resolve(f"n{n}.hang.test", 443, 0.05)
    assert dns.resolve("127.0.0.1", 443, 0.05) == ["127.0.0.1"]
    assert dns.resolve("[::1]", 443, 0.05) == ["::1"]
    assert len(hung_resolver) <= dns.WORKERS
    assert sum(t.name.startswith("recon-dns") for t in threading.enumerate()) <= dns.WORKERS
