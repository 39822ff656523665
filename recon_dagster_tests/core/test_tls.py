"""One TLS context per process: the clients share it, and it verifies exactly as httpx's own would."""

from __future__ import annotations

import ipaddress
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from recon_dagster.core import tls
from recon_dagster.media.egress import new_media_client
from recon_dagster.providers.http import HttpSettings, ProviderHttp
from recon_dagster.reconcile import finalize
from recon_dagster_tests.support.certs import self_signed


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def https_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on loopback whose certificate (for 127.0.0.1) no public bundle trusts."""
    cert_path, key_path = self_signed(
        tmp_path_factory.mktemp("tls"), "recon test CA", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_path, key_path)
    server.socket = server_ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert_path
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fresh_contexts(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """No context cached yet; returns what every CA-bundle load from here on loaded."""
    loads: list[object] = []
    real = ssl.SSLContext.load_verify_locations

    def counting(
        self: ssl.SSLContext, cafile: object = None, capath: object = None, cadata: object = None
    ) -> None:
        loads.append(cafile or capath)
        real(self, cafile, capath, cadata)  # type: ignore[arg-type]

    monkeypatch.setattr(tls, "_contexts", {})
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    return loads


def _provider_http(provider: str) -> ProviderHttp:
    return ProviderHttp(provider, "https://127.0.0.1:9", {}, "", HttpSettings(), lambda _r: None)


def test_every_client_of_a_process_loads_the_ca_bundle_once(
    fresh_contexts: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    clients = [_provider_http(p) for p in ("kie", "replicate", "elevenlabs", "anthropic", "kie")]
    # The process's media client is built anew, as in a new run worker.
    monkeypatch.setattr(finalize, "_media_client", None)
    media = finalize.shared_media_client()
    try:
        # One context for the provider clients and the media downloads (both honour SSL_CERT_FILE,
        # as a TLS-inspecting egress proxy needs): one load of the bundle, where each of the six
        # clients had loaded it.
        assert len(fresh_contexts) == 1
        assert tls.shared_tls_context() is tls.shared_tls_context()
        assert tls.shared_tls_context(trust_env=False) is not tls.shared_tls_context()
        assert media is finalize.shared_media_client()
    finally:
        for c in clients:
            c.close()


def test_the_shared_context_refuses_a_certificate_no_bundle_trusts(
    https_server: tuple[str, Path], fresh_contexts: list[object]
) -> None:
    url, _cert = https_server
    http = _provider_http("kie")
    try:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            http.client.get(f"{url}/")
    finally:
        http.close()
    with (
        new_media_client() as client,
        pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        client.get(f"{url}/")


def test_ssl_cert_file_names_the_bundle_of_provider_clients_and_media_downloads(
    https_server: tuple[str, Path], fresh_contexts: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cert = https_server
    before = tls.shared_tls_context()
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    http = _provider_http("kie")
    try:
        assert http.client.get(f"{url}/").json() == {"ok": True}
    finally:
        http.close()
    assert tls.shared_tls_context() is not before  # a changed variable got a context of its own
    # Media downloads take the same bundle: behind a TLS-inspecting egress proxy they must.
    with new_media_client() as client:
        assert client.get(f"{url}/").json() == {"ok": True}
