"""The media guard and the deployment's egress proxy, together.

The rules (``recon_dagster/media/egress.py``): the guard decides every hop before the proxy sees
anything; a checked host is tunnelled to by the address that was checked (``CONNECT <address>``,
TLS naming and verifying the host), so the proxy never resolves the name again; a host listed in
``RECON_MEDIA_ALLOWED_HOSTS`` goes by name; ``NO_PROXY`` is matched against the name. A real
forward proxy on loopback (``support.proxy``) counts what it saw. On main at 4786a20 the media
client ignored the proxy variables (and ``SSL_CERT_FILE``): every test here that expects the proxy
to see a request failed there.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from recon_dagster.media import download
from recon_dagster.media.download import Hop, open_media_stream
from recon_dagster.media.errors import MediaFetchError, MediaRefused
from recon_dagster.reconcile import finalize
from recon_dagster_tests.support.certs import self_signed
from recon_dagster_tests.support.media_server import MediaServer, pattern_bytes
from recon_dagster_tests.support.proxy import ForwardProxy, TlsFront, forward_proxy

pytestmark = pytest.mark.timeout(60)

MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def clean_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setattr(finalize, "_media_client", None)  # built for this test's variables


@pytest.fixture(scope="module")
def tls_media(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MediaServer, Path]]:
    """An HTTPS media server on 127.0.0.1 whose certificate names ``media.test`` and
    ``localhost``; yields it and the certificate file to trust."""
    cert, key = self_signed(
        tmp_path_factory.mktemp("tls"),
        "media.test",
        [x509.DNSName("media.test"), x509.DNSName("localhost")],
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with MediaServer(tls=context) as server:
        yield server, cert


@pytest.fixture
def proxy() -> Iterator[ForwardProxy]:
    with forward_proxy() as running:
        yield running


def _as_public_name(name: str) -> Callable[[str | httpx.URL], Hop]:
    """The guard's check for a public host ``name`` that resolves to 127.0.0.1 (the real policy
    refuses loopback, so a test stands in for the resolver's answer, as test_media_download does)."""

    def check(url: str | httpx.URL) -> Hop:
        parsed = httpx.URL(url)
        assert parsed.host == name
        return Hop(parsed, parsed.copy_with(host="127.0.0.1"), parsed.netloc.decode(), name)

    return check


def _fetch_pinned(server: MediaServer, path: str = "/echo-headers") -> bytes:
    """One pinned download of ``https://media.test:<port><path>`` with the process's media client."""
    url = f"https://media.test:{server.port}{path}"
    client = finalize.shared_media_client()
    response, _ = download._open(client, url, MIB, {}, 10, _as_public_name("media.test"))
    try:
        return response.read()
    finally:
        response.close()


def test_a_pinned_download_tunnels_to_the_checked_address_and_verifies_the_name(
    tls_media, proxy, monkeypatch
):
    server, cert = tls_media
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))

    seen = json.loads(_fetch_pinned(server))

    # The proxy was asked for the address the guard checked, never for the name: it cannot
    # resolve media.test again and be sent elsewhere. Inside the tunnel the server was addressed
    # by name, and its certificate for media.test verified.
    assert proxy.seen == [("CONNECT", f"127.0.0.1:{server.port}")]
    assert seen["host"] == f"media.test:{server.port}"


def test_a_pinned_download_refuses_a_certificate_for_another_name_through_the_tunnel(
    tls_media, proxy, monkeypatch
):
    server, cert = tls_media
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    url = f"https://other.test:{server.port}/bytes?n=10"
    with pytest.raises(MediaFetchError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
        download._open(finalize.shared_media_client(), url, MIB, {}, 10, _as_public_name("other.test"))
    assert proxy.seen == [("CONNECT", f"127.0.0.1:{server.port}")]


@pytest.mark.parametrize(
    ("no_proxy", "proxied"),
    [("media.test", False), (".test", False), ("127.0.0.1", True), ("other.test", True)],
)
def test_no_proxy_is_matched_against_the_name_not_the_pinned_address(
    tls_media, proxy, monkeypatch, no_proxy, proxied
):
    server, cert = tls_media
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", no_proxy)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))

    assert json.loads(_fetch_pinned(server))["host"] == f"media.test:{server.port}"
    assert proxy.seen == ([("CONNECT", f"127.0.0.1:{server.port}")] if proxied else [])


def test_an_allowed_host_goes_by_name_through_the_tunnel(tls_media, proxy, monkeypatch):
    server, cert = tls_media
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    url = f"https://localhost:{server.port}/bytes?n=5000&type=image/png"

    client = finalize.shared_media_client()
    with open_media_stream(
        url, max_bytes=MIB, allowed_hosts={f"localhost:{server.port}"}, client=client
    ) as stream:
        body = b"".join(stream.iter_chunks())

    assert body == pattern_bytes(5000)
    assert proxy.seen == [("CONNECT", f"localhost:{server.port}")]  # the proxy resolves a listed name


def test_a_plain_http_allowed_host_is_forwarded_by_the_proxy(proxy, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    with MediaServer() as server:
        client = finalize.shared_media_client()
        with open_media_stream(
            server.url("/bytes?n=3000"), max_bytes=MIB, allowed_hosts={server.host}, client=client
        ) as stream:
            assert b"".join(stream.iter_chunks()) == pattern_bytes(3000)
        assert proxy.seen == [("GET", server.url("/bytes?n=3000"))]


def test_a_proxy_that_admits_only_names_refuses_a_pinned_tunnel_with_a_clear_error(tls_media, monkeypatch):
    """The documented cost of pinning through a proxy: a proxy whose rules admit CONNECT only to
    listed names refuses the address; the download fails (nothing fetched from elsewhere)."""
    server, cert = tls_media
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with forward_proxy(refuse=lambda host: host[0].isdigit()) as names_only:
        monkeypatch.setenv("HTTPS_PROXY", names_only.url)
        with pytest.raises(MediaFetchError, match="ProxyError.*403"):
            _fetch_pinned(server)
    assert names_only.seen == [("CONNECT", f"127.0.0.1:{server.port}")]


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1:{port}/bytes?n=10",  # loopback, not listed
        "https://10.1.2.3/x.png",  # private
        "https://169.254.169.254/latest/meta-data/",  # the cloud metadata address
        "http://media.example/x.png",  # plain http to a host that is not listed
    ],
)
def test_the_guard_refuses_before_the_proxy_sees_anything(proxy, monkeypatch, url):
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    client = finalize.shared_media_client()
    with (
        pytest.raises(MediaRefused),
        open_media_stream(url.format(port=proxy.port), max_bytes=MIB, allowed_hosts=(), client=client),
    ):
        pass
    assert proxy.seen == []


def test_a_name_resolving_to_a_private_address_is_refused_before_the_proxy(proxy, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    with (
        pytest.raises(MediaRefused, match="non-public address 10.0.0.7"),
        open_media_stream(
            "https://cdn.example/x.png",
            max_bytes=MIB,
            allowed_hosts=(),
            client=finalize.shared_media_client(),
            resolver=lambda _host, _port: ["93.184.216.34", "10.0.0.7"],
        ),
    ):
        pass
    assert proxy.seen == []


def test_a_redirect_through_the_proxy_to_a_private_address_is_refused(proxy, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    with MediaServer() as server:
        url = server.url("/redirect?to=http://169.254.169.254/latest/meta-data/")
        client = finalize.shared_media_client()
        with (
            pytest.raises(MediaRefused, match="redirect refused"),
            open_media_stream(url, max_bytes=MIB, allowed_hosts={server.host}, client=client),
        ):
            pass
    # The first hop went through the proxy; the redirect's target never reached it.
    assert [target for _method, target in proxy.seen] == [url]


def test_a_pinned_tunnel_sends_the_proxy_credentials(tls_media, monkeypatch):
    server, cert = tls_media
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with forward_proxy(credentials=("egress", "pr0xy-s3cret-pass")) as guarded:
        monkeypatch.setenv("HTTPS_PROXY", guarded.url.replace("://", "://egress:pr0xy-s3cret-pass@"))
        assert json.loads(_fetch_pinned(server))["host"] == f"media.test:{server.port}"
        assert guarded.seen == [("CONNECT", f"127.0.0.1:{server.port}")]


def test_a_pinned_tunnel_through_an_https_proxy_is_tls_inside_tls(tls_media, tmp_path, monkeypatch):
    """The proxy itself spoken to over TLS (``HTTPS_PROXY=https://...``), the media server's TLS
    inside the tunnel: both certificates verified, the tunnel still to the checked address."""
    server, cert = tls_media
    with forward_proxy() as proxy, TlsFront(proxy.port, tmp_path) as front:
        both = tmp_path / "both.pem"
        both.write_bytes(Path(cert).read_bytes() + Path(front.ca_file).read_bytes())
        monkeypatch.setenv("SSL_CERT_FILE", str(both))
        monkeypatch.setenv("HTTPS_PROXY", f"https://localhost:{front.port}")
        assert json.loads(_fetch_pinned(server))["host"] == f"media.test:{server.port}"
        assert proxy.seen == [("CONNECT", f"127.0.0.1:{server.port}")]
