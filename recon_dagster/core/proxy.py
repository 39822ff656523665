"""Forward proxies: their credentials kept secret, and a ``CONNECT`` tunnel to a chosen address.

A proxy URL in ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` may carry ``user:password@``:
``register_proxy_credentials`` registers every such password as a secret (``core.redaction``), so
no log line or error shows it, whatever path printed the URL.

httpx's own proxy transport tunnels to the request URL's host and then checks the server's
certificate against that same host. A media download pinned to a checked address needs the two
apart: the tunnel must go to the checked address (else the proxy resolves the name again, and a
second DNS answer could send it to a private address the check refused), while TLS must name and
verify the host the URL named. So the media client's transports for HTTPS through a proxy are
httpx's ordinary transport whose network backend opens each connection as a tunnel
(``core.deadlines.guard_transport(..., tunnel=proxy)``): the URL carries the checked address, the
``sni_hostname`` extension the name, exactly as for a direct connection.

The ``CONNECT`` exchange itself is httpcore's (``HTTP11Connection``, h11's parser), sent on the
stream already connected to the proxy; what is built here is only the request httpcore's own
``HTTPProxy`` builds: the target, ``Host``, and ``Proxy-Authorization`` from the proxy URL's
credentials.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import httpcore
import httpx

from recon_dagster.core.redaction import redact_secrets, register_secret

# The password of ``[scheme://]user:password@host...``, read without parsing the URL (a malformed
# one must not escape masking by failing to parse).
_PASSWORD = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://)?[^/@:]*:([^/@]*)@")


def register_proxy_credentials() -> None:
    """Mask, from now on, the password of every proxy the environment names (the variables as
    httpx and urllib read them, either case)."""
    for scheme, url in urllib.request.getproxies_environment().items():
        found = _PASSWORD.match(url.strip()) if scheme != "no" else None
        if found and found.group(1):
            register_secret(found.group(1))
            register_secret(urllib.parse.unquote(found.group(1)))


@contextmanager
def proxy_settings() -> Iterator[None]:
    """Around building a client from the environment's proxies: their passwords registered as
    secrets first, and a proxy httpx cannot use (an unknown scheme, SOCKS without ``socksio``) as
    one ``ValueError`` naming the variables, its credentials masked."""
    register_proxy_credentials()
    try:
        yield
    except (ValueError, ImportError, httpx.InvalidURL) as exc:
        raise ValueError(f"HTTP_PROXY / HTTPS_PROXY / ALL_PROXY: {redact_secrets(str(exc))}") from None


def _target(host: str, port: int) -> bytes:
    host = host.strip("[]")
    return (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode("ascii")


def proxy_headers(proxy: httpx.Proxy) -> list[tuple[bytes, bytes]]:
    """The headers a ``CONNECT`` to ``proxy`` carries beyond ``Host``: its credentials, if any."""
    headers = list(proxy.headers.raw)
    if proxy.raw_auth is not None:
        user, password = proxy.raw_auth
        headers.insert(0, (b"Proxy-Authorization", b"Basic " + base64.b64encode(user + b":" + password)))
    return headers


def open_tunnel(
    stream: httpcore.NetworkStream, proxy: httpx.Proxy, host: str, port: int, timeout: float | None
) -> httpcore.NetworkStream:
    """Ask the proxy at the other end of ``stream`` for a tunnel to ``host:port``; returns the
    tunnel's stream (the caller starts TLS on it), or raises ``httpcore.ProxyError`` with the
    proxy's status when it refuses. ``stream`` is closed on failure."""
    url = proxy.url
    origin = httpcore.Origin(url.raw_scheme, url.raw_host, url.port or (443 if url.scheme == "https" else 80))
    target = _target(host, port)
    connection = httpcore.HTTP11Connection(origin=origin, stream=stream)
    request = httpcore.Request(
        b"CONNECT",
        httpcore.URL(scheme=origin.scheme, host=origin.host, port=origin.port, target=target),
        headers=[(b"Host", target), (b"Accept", b"*/*"), *proxy_headers(proxy)],
        extensions={"timeout": {"read": timeout, "write": timeout}},
    )
    try:
        response = connection.handle_request(request)
    except BaseException:
        connection.close()
        raise
    if not 200 <= response.status < 300:
        reason = response.extensions.get("reason_phrase", b"").decode("ascii", errors="replace")
        connection.close()
        raise httpcore.ProxyError(f"the proxy refused CONNECT {target.decode()}: {response.status} {reason}")
    tunnel: httpcore.NetworkStream = response.extensions["network_stream"]
    return tunnel


__all__ = ["open_tunnel", "proxy_headers", "proxy_settings", "register_proxy_credentials"]
