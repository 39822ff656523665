"""open_media_stream against a real loopback HTTP server: policy, redirects, caps, redaction."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator

import httpx
import pytest

from recon_dagster.media import download
from recon_dagster.media.download import (
    MAX_REDIRECTS,
    Hop,
    allowed_hosts_from_env,
    check_url,
    is_public_address,
    open_media_stream,
    parse_allowed_hosts,
)
from recon_dagster.media.errors import (
    MediaError,
    MediaExpired,
    MediaFetchError,
    MediaRefused,
    MediaTooLarge,
    redact_url,
)
from recon_dagster_tests.support.certs import self_signed
from recon_dagster_tests.support.media_server import MediaServer, pattern_bytes

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def server() -> Iterator[MediaServer]:
    with MediaServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def other_server() -> Iterator[MediaServer]:
    with MediaServer() as srv:
        yield srv


def read_all(url: str, **kwargs: object) -> tuple[bytes, object]:
    with open_media_stream(url, **kwargs) as stream:  # type: ignore[arg-type]
        return b"".join(stream.iter_chunks()), stream


# --- allowed hosts -----------------------------------------------------------------------------


def test_allowed_host_over_http_streams_the_body(server: MediaServer) -> None:
    body, stream = read_all(
        server.url("/bytes?n=300000&type=image/png"), max_bytes=MIB, allowed_hosts={server.host}
    )
    assert body == pattern_bytes(300000)
    assert stream.content_type == "image/png"  # type: ignore[attr-defined]
    assert stream.content_length == 300000  # type: ignore[attr-defined]
    assert stream.bytes_read == 300000  # type: ignore[attr-defined]


def test_allowed_host_without_port_allows_any_port(server: MediaServer) -> None:
    body, _ = read_all(server.url("/bytes?n=10"), max_bytes=100, allowed_hosts={"127.0.0.1"})
    assert body == pattern_bytes(10)


def test_body_exactly_at_cap_is_accepted(server: MediaServer) -> None:
    body, _ = read_all(server.url("/bytes?n=5000"), max_bytes=5000, allowed_hosts={server.host})
    assert len(body) == 5000


def test_allowed_hosts_come_from_env(server: MediaServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECON_MEDIA_ALLOWED_HOSTS", f" sandbox.local , {server.host},[::1]:9000")
    assert allowed_hosts_from_env() == {"sandbox.local", server.host, "[::1]:9000"}
    body, _ = read_all(server.url("/bytes?n=10"), max_bytes=100)
    assert body == pattern_bytes(10)
    monkeypatch.delenv("RECON_MEDIA_ALLOWED_HOSTS")
    with pytest.raises(MediaRefused):
        read_all(server.url("/bytes?n=10"), max_bytes=100)


@pytest.mark.parametrize("bad", ["host:notaport", "host:0", "host:70000", ":80", "[::1]x"])
def test_bad_allowed_host_entries_are_named(bad: str) -> None:
    with pytest.raises(ValueError, match="RECON_MEDIA_ALLOWED_HOSTS"):
        parse_allowed_hosts(f"ok.example,{bad}")


def test_allowed_ipv6_entry_matches_bracketless_host() -> None:
    hop = check_url("http://[::1]:9000/x", parse_allowed_hosts("[::1]:9000"))
    assert str(hop.connect_url) == "http://[::1]:9000/x"


# --- refusals ----------------------------------------------------------------------------------


def test_unlisted_loopback_is_refused_without_a_request(server: MediaServer) -> None:
    before = len(server.requests)
    with pytest.raises(MediaRefused, match="127.0.0.1"):
        read_all(server.url("/bytes"), max_bytes=100, allowed_hosts=set())
    with pytest.raises(MediaRefused, match="not public"):
        read_all(f"https://127.0.0.1:{server.port}/bytes", max_bytes=100, allowed_hosts=set())
    assert len(server.requests) == before


def test_name_resolving_to_loopback_is_refused(server: MediaServer) -> None:
    with pytest.raises(MediaRefused, match="non-public address 127.0.0.1"):
        read_all(f"https://localhost:{server.port}/bytes", max_bytes=100, allowed_hosts=set())


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/iam/", "not public"),
        ("https://169.254.169.254/latest/meta-data/", "not public"),
        ("http://10.0.0.1/", "not public"),
        ("https://172.16.5.4/", "not public"),
        ("https://192.168.1.1/", "not public"),
        ("https://100.64.0.1/", "not public"),
        ("http://[::1]/", "not public"),
        ("https://[fe80::1]/", "not public"),
        ("https://[fc00::1]/", "not public"),
        ("https://[::ffff:169.254.169.254]/", "not public"),
        ("https://[::ffff:10.0.0.1]/", "not public"),
        ("https://[2002:a00:1::]/", "not public"),  # 6to4 wrapping 10.0.0.1
        ("https://0.0.0.0/", "not public"),
        ("https://224.0.0.1/", "not public"),
        ("https://2130706433/", "non-public address 127.0.0.1"),  # decimal spelling of 127.0.0.1
        ("https://0x7f.0.0.1/", "non-public address 127.0.0.1"),
        ("file:///etc/passwd", "scheme 'file'"),
        ("ftp://example.com/a.png", "scheme 'ftp'"),
        ("gopher://example.com/", "scheme 'gopher'"),
        ("javascript:alert(1)", "scheme"),
        ("https://user:pass@example.com/a.png", "userinfo"),
        ("https://user@example.com/a.png", "userinfo"),
        ("http://example.com/a.png", "plain http"),
        ("not a url", "scheme"),
    ],
)
def test_refused_urls(url: str, reason: str) -> None:
    with pytest.raises(MediaRefused, match=reason) as info:
        read_all(url, max_bytes=100, allowed_hosts=set())
    assert "pass@" not in str(info.value)


def test_every_resolved_address_must_be_public() -> None:
    def mixed(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "10.1.2.3"]

    with pytest.raises(MediaRefused, match="10.1.2.3"):
        check_url("https://media.example/a.png", resolver=mixed)


def test_public_name_is_pinned_to_the_checked_address() -> None:
    hop = check_url("https://cdn.example:8443/o/a.png?sig=1", resolver=lambda h, p: ["93.184.216.34"])
    assert hop.connect_url.host == "93.184.216.34"
    assert hop.connect_url.port == 8443
    assert hop.connect_url.path == "/o/a.png"
    assert hop.host_header == "cdn.example:8443"
    assert hop.sni_hostname == "cdn.example"


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.216.34", True),
        ("2606:4700::1", True),
        ("127.0.0.1", False),
        ("169.254.169.254", False),
        ("100.100.1.1", False),
        ("239.1.1.1", False),
        ("255.255.255.255", False),
        ("::", False),
        ("ff02::1", False),
        ("::ffff:127.0.0.1", False),
        ("64:ff9b::a00:1", False),
        ("2001:db8::1", False),
    ],
)
def test_is_public_address(address: str, public: bool) -> None:
    assert is_public_address(address) is public


# --- redirects ---------------------------------------------------------------------------------


def test_redirects_are_followed_on_allowed_hosts(server: MediaServer, other_server: MediaServer) -> None:
    target = other_server.url("/bytes?n=123")
    body, stream = read_all(
        server.url(f"/redirect?to={target}&code=307"),
        max_bytes=1000,
        allowed_hosts={server.host, other_server.host},
    )
    assert body == pattern_bytes(123)
    assert stream.url == other_server.url("/bytes?<redacted>")  # type: ignore[attr-defined]


def test_redirect_to_unlisted_port_is_refused(server: MediaServer, other_server: MediaServer) -> None:
    before = len(other_server.requests)
    with pytest.raises(MediaRefused, match="redirect refused") as info:
        read_all(
            server.url(f"/redirect?to={other_server.url('/bytes')}"),
            max_bytes=1000,
            allowed_hosts={server.host},
        )
    assert str(other_server.port) in str(info.value)
    assert len(other_server.requests) == before


@pytest.mark.parametrize(
    "target",
    [
        "http://169.254.169.254/latest/meta-data/",
        "https://169.254.169.254/latest/meta-data/",
        "file:///etc/passwd",
        "gopher://127.0.0.1:70/",
        "https://admin:pw@example.com/",
    ],
)
def test_redirect_from_allowed_host_to_forbidden_target_is_refused(server: MediaServer, target: str) -> None:
    with pytest.raises(MediaRefused, match="redirect refused"):
        read_all(server.url(f"/redirect?to={target}"), max_bytes=1000, allowed_hosts={server.host})


def test_redirect_limit(server: MediaServer) -> None:
    body, _ = read_all(server.url(f"/chain?n={MAX_REDIRECTS}"), max_bytes=100, allowed_hosts={server.host})
    assert body == pattern_bytes(10)
    with pytest.raises(MediaFetchError, match="redirects"):
        read_all(server.url(f"/chain?n={MAX_REDIRECTS + 1}"), max_bytes=100, allowed_hosts={server.host})


def test_caller_headers_stay_on_the_original_origin(server: MediaServer, other_server: MediaServer) -> None:
    allowed = {server.host, other_server.host}
    secret = {"xi-api-key": "sk-not-for-others"}
    body, _ = read_all(
        server.url("/redirect?to=/echo-headers"), max_bytes=10000, allowed_hosts=allowed, headers=secret
    )
    assert json.loads(body)["xi-api-key"] == "sk-not-for-others"
    body, _ = read_all(
        server.url(f"/redirect?to={other_server.url('/echo-headers')}"),
        max_bytes=10000,
        allowed_hosts=allowed,
        headers=secret,
    )
    assert "xi-api-key" not in json.loads(body)


# --- status codes, caps, failures --------------------------------------------------------------


@pytest.mark.parametrize("code", [403, 404, 410])
def test_gone_media_is_expired(server: MediaServer, code: int) -> None:
    with pytest.raises(MediaExpired) as info:
        read_all(
            server.url(f"/status/{code}?X-Amz-Signature=abc"), max_bytes=100, allowed_hosts={server.host}
        )
    assert info.value.status_code == code
    assert f"HTTP {code}" in str(info.value)


@pytest.mark.parametrize("code", [500, 502, 429, 400])
def test_other_statuses_are_fetch_errors(server: MediaServer, code: int) -> None:
    with pytest.raises(MediaFetchError) as info:
        read_all(server.url(f"/status/{code}"), max_bytes=100, allowed_hosts={server.host})
    assert info.value.status_code == code
    assert not isinstance(info.value, MediaExpired)


def test_oversized_body_stops_at_the_cap(server: MediaServer) -> None:
    cap = 3 * MIB
    received = 0
    with (
        pytest.raises(MediaTooLarge, match=f"cap of {cap} bytes") as info,
        open_media_stream(
            server.url("/huge?limit=1073741824"), max_bytes=cap, allowed_hosts={server.host}
        ) as s,
    ):
        for chunk in s.iter_chunks():
            received += len(chunk)
    assert received <= cap
    assert cap < info.value.seen <= cap + 64 * 1024
    assert info.value.max_bytes == cap


def test_declared_length_over_cap_fails_before_reading(server: MediaServer) -> None:
    opened = False
    with (
        pytest.raises(MediaTooLarge, match="declared Content-Length"),
        open_media_stream(server.url("/declared-huge"), max_bytes=MIB, allowed_hosts={server.host}),
    ):
        opened = True
    assert not opened


def test_truncated_body_is_a_fetch_error(server: MediaServer) -> None:
    with pytest.raises(MediaFetchError, match="reading body failed"):
        read_all(server.url("/truncated"), max_bytes=MIB, allowed_hosts={server.host})


def test_deadline_stops_a_dripping_server(server: MediaServer) -> None:
    with pytest.raises(MediaFetchError, match="deadline of 0.2 s passed"):
        read_all(server.url("/drip"), max_bytes=MIB, allowed_hosts={server.host}, deadline_s=0.2)


def test_allowed_hosts_as_a_single_string(server: MediaServer) -> None:
    body, _ = read_all(server.url("/bytes?n=10"), max_bytes=100, allowed_hosts=server.host)
    assert body == pattern_bytes(10)


def test_connection_refused_is_a_fetch_error() -> None:
    with MediaServer() as dead:
        url = dead.url("/bytes")
        host = dead.host
    with pytest.raises(MediaFetchError, match="request failed"):
        read_all(url, max_bytes=100, allowed_hosts={host})


def test_unresolvable_name_is_a_fetch_error() -> None:
    with pytest.raises(MediaFetchError, match="cannot resolve"):
        read_all("https://no-such-host.invalid/a.png", max_bytes=100, allowed_hosts=set())


# --- redaction ---------------------------------------------------------------------------------


def test_messages_hide_the_query_string(server: MediaServer) -> None:
    secret = "X-Amz-Signature=deadbeefsecret&token=hunter2"
    cases: list[tuple[str, dict[str, object]]] = [
        (server.url(f"/status/403?{secret}"), {"allowed_hosts": {server.host}}),
        (server.url(f"/status/500?{secret}"), {"allowed_hosts": {server.host}}),
        (server.url(f"/huge?limit=4194304&{secret}"), {"allowed_hosts": {server.host}}),
        (server.url(f"/bytes?{secret}"), {"allowed_hosts": set()}),
        (f"https://10.0.0.1/a.png?{secret}", {"allowed_hosts": set()}),
        (server.url(f"/redirect?to=http://169.254.169.254/x%3F{secret}"), {"allowed_hosts": {server.host}}),
    ]
    for url, kwargs in cases:
        with pytest.raises(MediaError) as info:
            read_all(url, max_bytes=MIB, **kwargs)
        text = f"{info.value} {info.value!r} {info.value.url}"
        assert "deadbeefsecret" not in text and "hunter2" not in text, text
        assert "<redacted>" in text, text


def test_redact_url() -> None:
    assert redact_url("https://u:p@cdn.example:8443/a/b.mp4?sig=1#frag") == (
        "https://cdn.example:8443/a/b.mp4?<redacted>#<redacted>"
    )
    assert redact_url("https://cdn.example/a.mp4") == "https://cdn.example/a.mp4"
    assert redact_url("http://[::1]:80/x?y") == "http://[::1]:80/x?<redacted>"


# --- address pinning over TLS --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MediaServer, ssl.SSLContext]]:
    """An HTTPS server on 127.0.0.1 whose certificate names only ``media.test``."""
    from cryptography import x509

    cert_path, key_path = self_signed(
        tmp_path_factory.mktemp("tls"), "media.test", [x509.DNSName("media.test")]
    )
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_path, key_path)
    with MediaServer(tls=server_ctx) as srv:
        client_ctx = ssl.create_default_context(cafile=str(cert_path))
        yield srv, client_ctx


def _pinned_check(port: int, sni: str) -> Callable[[str | httpx.URL], Hop]:
    """Stands in for a public name resolving to 127.0.0.1 (loopback is refused by the real policy)."""

    def check(url: str | httpx.URL) -> Hop:
        parsed = httpx.URL(url)
        return Hop(parsed, parsed.copy_with(host="127.0.0.1"), parsed.netloc.decode(), sni)

    return check


def test_pinned_connection_verifies_tls_against_the_name(
    tls_server: tuple[MediaServer, ssl.SSLContext],
) -> None:
    srv, ctx = tls_server
    url = f"https://media.test:{srv.port}/echo-headers"
    with httpx.Client(verify=ctx, trust_env=False) as client:
        response, final = download._open(client, url, 10_000, {}, 5, _pinned_check(srv.port, "media.test"))
        try:
            seen = json.loads(response.read())
        finally:
            response.close()
    # Connected to the pinned address, yet the server saw the name, and the certificate for the
    # name verified: the pin does not weaken TLS.
    assert seen["host"] == f"media.test:{srv.port}"
    assert final.host == "media.test"


def test_pinned_connection_refuses_a_certificate_for_another_name(
    tls_server: tuple[MediaServer, ssl.SSLContext],
) -> None:
    srv, ctx = tls_server
    url = f"https://other.test:{srv.port}/bytes?n=10"
    with (
        httpx.Client(verify=ctx, trust_env=False) as client,
        pytest.raises(MediaFetchError, match="ConnectError"),
    ):
        download._open(client, url, 10_000, {}, 5, _pinned_check(srv.port, "other.test"))
