"""How a media download leaves the process: directly, or through the deployment's egress proxy.

The media client honours the same environment as the provider clients, read by httpx's own
helper with httpx's rules: ``HTTPS_PROXY`` for ``https`` URLs, ``HTTP_PROXY`` for ``http``,
``ALL_PROXY`` for both, ``NO_PROXY`` (host names, ``.domain`` suffixes, addresses, ``*``) for the
hosts that go direct. In a cluster whose egress goes through a proxy, a download that went
direct would fail, and the job would count attempts until it is refunded although its result
exists.

The SSRF guard (``media.download``) still decides every hop, and a proxy does not weaken it:

- A host that is not in ``RECON_MEDIA_ALLOWED_HOSTS`` is resolved here, every address must be
  public, and the connection goes to the checked address, through the proxy too: the tunnel is a
  ``CONNECT`` to the address (``core.proxy``), never to the name, so the proxy cannot resolve the
  name a second time and reach a private address the check refused (DNS rebinding, or a proxy
  that sees a split-horizon DNS: its own network, its cloud metadata address). TLS inside the
  tunnel names the host (SNI) and verifies its certificate against the name, end to end: the
  proxy sees an address and encrypted bytes. Only ``https`` reaches such a host.
- A host in ``RECON_MEDIA_ALLOWED_HOSTS`` is trusted by configuration and goes by name: a
  ``CONNECT`` to the name for ``https``, an ordinary forwarded request for plain ``http`` (a
  proxy resolves it, as the system resolver would without one).
- ``NO_PROXY`` is matched against the host's name, not the address it was pinned to.

So a proxy that admits tunnels only to listed domain names refuses the pinned ones; list those
hosts in ``RECON_MEDIA_ALLOWED_HOSTS`` (the operator then vouches for them, as for any listed host)
or let the proxy admit ``CONNECT`` to public addresses on port 443. A TLS-inspecting proxy needs its
CA in ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``, which the media client honours as the provider clients
do. Keep-alive is off on every route: a connection opened to one pinned address with one TLS name
must never carry another host's request.
"""

from __future__ import annotations

import http.cookiejar
import ssl

import httpx
from httpx._utils import URLPattern, get_environment_proxies

from recon_dagster.core.deadlines import guard_transport
from recon_dagster.core.proxy import proxy_settings
from recon_dagster.core.tls import shared_tls_context

# One use per connection (see the module docstring); connections are not capped here: the
# reconcile threads are.
_ONE_USE = httpx.Limits(max_connections=None, max_keepalive_connections=0)


def _own_transport(ssl_context: ssl.SSLContext, proxy: httpx.Proxy | None = None) -> httpx.BaseTransport:
    return httpx.HTTPTransport(verify=ssl_context, limits=_ONE_USE, proxy=proxy)


class _ProxyRoute(httpx.BaseTransport):
    """Every media request through one proxy: ``https`` in a tunnel to the URL's host (the checked
    address when pinned), ``http`` forwarded in the proxy's absolute form (SOCKS proxies: httpx's
    own transport, which connects to the URL's host and names the ``sni_hostname`` in TLS)."""

    def __init__(self, proxy: httpx.Proxy, ssl_context: ssl.SSLContext) -> None:
        self.proxy = proxy
        self._forward = guard_transport(_own_transport(ssl_context, proxy))
        if proxy.url.scheme in ("http", "https"):
            self._tunnel = guard_transport(_own_transport(ssl_context), tunnel=proxy)
        else:
            self._tunnel = self._forward

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        route = self._tunnel if request.url.scheme == "https" else self._forward
        return route.handle_request(request)

    def close(self) -> None:
        self._forward.close()
        self._tunnel.close()


class MediaTransport(httpx.BaseTransport):
    """Routes each media request by its host's name (the ``sni_hostname`` extension of a pinned
    hop, else the URL's host) to the proxy the environment names for it, or direct."""

    def __init__(self, ssl_context: ssl.SSLContext, proxies: dict[str, str | None]) -> None:
        self._direct = guard_transport(_own_transport(ssl_context))
        routes: dict[str, _ProxyRoute] = {}
        patterns: dict[URLPattern, _ProxyRoute | None] = {}
        for pattern, url in proxies.items():
            if url is not None and url not in routes:
                routes[url] = _ProxyRoute(httpx.Proxy(url), ssl_context)
            patterns[URLPattern(pattern)] = None if url is None else routes[url]
        self._routes = list(routes.values())
        self._patterns = sorted(patterns.items())  # httpx's order: the most specific first

    def _route(self, url: httpx.URL) -> _ProxyRoute | None:
        for pattern, route in self._patterns:
            if pattern.matches(url):
                return route
        return None

    def route_for(self, url: httpx.URL) -> httpx.Proxy | None:
        """The proxy a request for ``url`` (by name) goes through, or None (direct)."""
        route = self._route(url)
        return None if route is None else route.proxy

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        name = request.extensions.get("sni_hostname")
        route = self._route(request.url.copy_with(host=name) if name else request.url)
        return (route or self._direct).handle_request(request)

    def close(self) -> None:
        self._direct.close()
        for route in self._routes:
            route.close()


def environment_proxies() -> dict[str, str | None]:
    """The proxy routes the environment names, as httpx reads them for a client with
    ``trust_env`` (pattern -> proxy URL, None: direct)."""
    return get_environment_proxies()


def new_media_client(ssl_context: ssl.SSLContext | None = None) -> httpx.Client:
    """A client for media downloads under the fetch policy (``media.download``): routed by
    ``MediaTransport`` (the environment's proxies, by name), every step of an exchange cut to its
    deadline (``core.deadlines.guard_transport``), redirects left to the caller (each hop is
    re-checked), no connection reused, no cookie kept (the client is shared by every download of
    the process, and a pinned URL's cookie domain is an address many hosts may share), and the
    process's shared TLS context unless ``ssl_context`` is given (tests)."""
    context = ssl_context or shared_tls_context()
    with proxy_settings():
        transport = MediaTransport(context, environment_proxies())
    return httpx.Client(
        trust_env=False,  # the routes above are the environment's; nothing else is read from it
        follow_redirects=False,
        cookies=http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[])),
        transport=transport,
    )


__all__ = ["MediaTransport", "environment_proxies", "new_media_client"]
