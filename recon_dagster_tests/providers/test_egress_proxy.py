"""Provider calls and media downloads honour the deployment's egress proxy.

A real forward proxy on loopback (``support.proxy``) counts what it saw: plain ``http`` polls
arrive at it in absolute form, ``https`` ones as a ``CONNECT`` to a TLS front before the sandbox,
``NO_PROXY`` sends them direct, and a full reconcile pass (sensor, poll, media download, settle)
goes through it end to end. On the HTTP/1.1 transport of main at 4786a20 the proxy saw nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from recon_dagster.providers import AmbiguousCreateError, ProviderHTTPError, providers_from_env
from recon_dagster.reconcile import finalize
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.support.payloads import PAYLOADS
from recon_dagster_tests.support.proxy import ForwardProxy, TlsFront, forward_proxy
from recon_dagster_tests.support.reconcile import make_defs, tick, usage_status

pytestmark = pytest.mark.timeout(120)

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
POLLED_KINDS = ["kie-standard", "replicate-prediction", "elevenlabs-async"]


@pytest.fixture(autouse=True)
def no_proxy_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variable from the machine, and a media client built for this test's variables."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setattr(finalize, "_media_client", None)


@pytest.fixture
def proxy() -> Iterator[ForwardProxy]:
    with forward_proxy() as running:
        yield running


@pytest.fixture
def tls_front(sandbox: SandboxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The sandbox behind TLS at ``https://localhost:<port>`` (its media URLs too), trusted through
    ``SSL_CERT_FILE``; yields that base URL."""
    with TlsFront(sandbox.port, tmp_path) as front:
        base = f"https://localhost:{front.port}"
        monkeypatch.setattr(sandbox.sandbox, "base_url", base)
        monkeypatch.setenv("SSL_CERT_FILE", str(front.ca_file))
        for name, value in sandbox.env().items():
            if name.endswith("_BASE_URL"):
                monkeypatch.setenv(name, value.replace(f"http://127.0.0.1:{sandbox.port}", base))
        monkeypatch.setenv("RECON_MEDIA_ALLOWED_HOSTS", f"localhost:{front.port}")
        yield base


def _requests_to(proxy: ForwardProxy, prefix: str) -> list[str]:
    return [target for method, target in proxy.seen if method != "CONNECT" and target.startswith(prefix)]


# --- polls ------------------------------------------------------------------------------------


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
@pytest.mark.parametrize("kind", POLLED_KINDS)
def test_a_plain_http_poll_goes_through_the_proxy(sandbox, proxy, monkeypatch, variable, kind):
    monkeypatch.setenv(variable, proxy.url)
    task = sandbox.add_task(kind, Scenario(polls_before_done=0))
    providers = providers_from_env()
    try:
        assert providers.poll(kind, task).state.value == "succeeded"
    finally:
        providers.close()
    # The poll reached the sandbox once, and through the proxy, in a proxy's absolute form.
    assert sandbox.poll_count(task) == 1
    assert len(_requests_to(proxy, sandbox.base_url)) == 1, proxy.seen


@pytest.mark.parametrize("kind", POLLED_KINDS)
def test_an_https_poll_goes_through_a_connect_tunnel(sandbox, proxy, tls_front, monkeypatch, kind):
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    task = sandbox.add_task(kind, Scenario(polls_before_done=0))
    providers = providers_from_env()
    try:
        assert providers.poll(kind, task).state.value == "succeeded"
        assert providers.poll(kind, task).state.value == "succeeded"
    finally:
        providers.close()
    assert sandbox.poll_count(task) == 2
    # One tunnel, to the provider's name (the proxy resolves it): the second poll reused it.
    assert proxy.seen == [("CONNECT", tls_front.removeprefix("https://"))]


@pytest.mark.parametrize(
    "no_proxy", ["127.0.0.1", "localhost,127.0.0.1:9,127.0.0.1", "*", "example.com,10.0.0.1"]
)
def test_no_proxy_sends_a_listed_host_direct(sandbox, proxy, monkeypatch, no_proxy):
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", no_proxy)
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    providers = providers_from_env()
    try:
        status = providers.poll("kie-standard", task)
    finally:
        providers.close()
    if "example.com" in no_proxy:  # other hosts listed: this one still goes through the proxy
        assert len(proxy.seen) == 1
    else:
        assert proxy.seen == []
    assert status.state.value == "succeeded" and sandbox.poll_count(task) == 1


@pytest.mark.slow
def test_a_create_the_proxy_refuses_was_never_sent_so_it_is_retried_not_ambiguous(
    sandbox, tls_front, monkeypatch
):
    """A 403 to CONNECT means the provider never saw the request: safe to send again, and after
    the retries it is a plain failure, not 'may have been billed'."""
    with forward_proxy(refuse=lambda host: host == "localhost") as refusing:
        monkeypatch.setenv("HTTPS_PROXY", refusing.url)
        providers = providers_from_env()
        kie = providers.kie.model_copy(update={"max_attempts": 3, "backoff_initial_s": 0.01})
        try:
            with pytest.raises(ProviderHTTPError, match="ProxyError") as caught:
                kie.create("kie-standard", PAYLOADS["kie-standard"])
        finally:
            providers.close()
    assert not isinstance(caught.value, AmbiguousCreateError)
    assert [method for method, _ in refusing.seen] == ["CONNECT"] * 3
    assert sandbox.create_count("kie-standard") == 0


# --- a whole reconcile pass: the poll and the media download --------------------------------------


def _stale_succeeded_job(db, sandbox):
    user = make_user(db)
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0, media_kind="image"))
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=30)
    reserve(db, job, user, 30)
    return job


def _completed(db, job, media_dir) -> None:
    row = job_row(db, job)
    assert row["status"] == "completed", row["reconcile_last_error"]
    assert usage_status(db, job) == "committed"
    assert [p for p in Path(media_dir).rglob("*") if p.is_file()]


def test_a_reconcile_pass_polls_and_downloads_through_the_http_proxy(
    db, instance, media_dir, sandbox, proxy, monkeypatch
):
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    job = _stale_succeeded_job(db, sandbox)

    tick(make_defs(media_dir), instance)

    _completed(db, job, media_dir)
    targets = _requests_to(proxy, sandbox.base_url)
    assert any("/kie/" in t for t in targets), targets  # the poll
    assert any("/media/" in t for t in targets), targets  # the media download


def test_a_reconcile_pass_polls_and_downloads_through_connect_tunnels(
    db, instance, media_dir, sandbox, proxy, tls_front, monkeypatch
):
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    job = _stale_succeeded_job(db, sandbox)

    tick(make_defs(media_dir), instance)

    _completed(db, job, media_dir)
    # Every byte went through tunnels to the TLS front: the provider client's, and the media
    # download's own (no connection is kept for media, so it opened its own tunnel).
    tunnels = [target for method, target in proxy.seen if method == "CONNECT"]
    assert len(tunnels) >= 2 and set(tunnels) == {tls_front.removeprefix("https://")}, proxy.seen
    assert _requests_to(proxy, "http") == []


def test_no_proxy_sends_a_reconcile_pass_direct(db, instance, media_dir, sandbox, proxy, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    job = _stale_succeeded_job(db, sandbox)

    tick(make_defs(media_dir), instance)

    _completed(db, job, media_dir)
    assert proxy.seen == []


# --- a proxy that wants credentials ----------------------------------------------------------------

PASSWORD = "pr0xy-s3cret-pass"


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_poll_sends_the_proxy_credentials_from_the_proxy_url(
    sandbox, tls_front, monkeypatch, caplog, scheme
):
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    if scheme == "http":  # the plain sandbox, not the TLS front
        monkeypatch.setenv("KIE_BASE_URL", f"http://127.0.0.1:{sandbox.port}/kie")
    with forward_proxy(credentials=("egress", PASSWORD)) as guarded:
        monkeypatch.setenv(f"{scheme.upper()}_PROXY", guarded.url.replace("://", f"://egress:{PASSWORD}@"))
        providers = providers_from_env()
        try:
            assert providers.poll("kie-standard", task).state.value == "succeeded"
        finally:
            providers.close()
        assert len(guarded.seen) == 1


def test_a_wrong_proxy_password_is_an_error_that_never_shows_it(sandbox, tls_front, monkeypatch, caplog):
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    with forward_proxy(credentials=("egress", "the-right-one")) as guarded:
        monkeypatch.setenv("HTTPS_PROXY", guarded.url.replace("://", f"://egress:{PASSWORD}@"))
        providers = providers_from_env()
        kie = providers.kie.model_copy(update={"max_attempts": 2, "backoff_initial_s": 0.01})
        try:
            with pytest.raises(ProviderHTTPError, match="407") as caught:
                kie.poll("kie-standard", task)
        finally:
            providers.close()
    assert PASSWORD not in str(caught.value) and PASSWORD not in caplog.text


def test_a_proxy_url_httpx_cannot_use_is_one_line_that_never_shows_its_password(sandbox, monkeypatch, caplog):
    monkeypatch.setenv("HTTPS_PROXY", f"ftp://egress:{PASSWORD}@proxy.internal:3128")
    with pytest.raises(ValueError, match="HTTP_PROXY / HTTPS_PROXY / ALL_PROXY") as caught:
        providers_from_env().poll("kie-standard", "task-1")
    assert PASSWORD not in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="HTTP_PROXY / HTTPS_PROXY / ALL_PROXY") as caught:
        finalize.shared_media_client()
    assert PASSWORD not in str(caught.value)
    # Registered as a secret once a client was built: masked in any log line that prints the URL.
    logging.getLogger("recon_dagster.test").warning("egress through %s", os.environ["HTTPS_PROXY"])
    assert "egress through" in caplog.text and PASSWORD not in caplog.text
