"""Streaming media download with an SSRF guard and a size cap.

``open_media_stream(url, max_bytes=...)`` yields a ``MediaStream`` whose ``iter_chunks()`` never
holds more than one chunk of the body, and stops with ``MediaTooLarge`` as soon as the cap is
passed (or before reading anything when Content-Length already exceeds it).

Fetch policy (applied to the first URL and again to every redirect hop, redirects being followed
by hand, at most ``MAX_REDIRECTS``):

- only ``https``; no userinfo (``user:pass@``); ``file``, ``ftp``, ``gopher`` and all other
  schemes refused;
- the host is resolved here and EVERY address it resolves to must be public: loopback, private
  (10/8, 172.16/12, 192.168/16), CGNAT 100.64/10, link-local (169.254/16 with the cloud metadata
  address, fe80::/10), unique-local fc00::/7, unspecified, multicast, reserved and
  documentation ranges are refused, also when spelled as IPv4-mapped, 6to4 or NAT64 IPv6;
- hosts named in ``allowed_hosts`` (``RECON_MEDIA_ALLOWED_HOSTS``: ``host`` or ``host:port``,
  comma-separated) skip the address check and may use plain ``http`` -- the sandbox needs that.
  An entry with a port allows only that port.

DNS rebinding: for a policy-checked host the connection goes to the address that was checked
(the request URL carries the IP; the ``Host`` header, TLS SNI and certificate verification use
the original name), so a second, different DNS answer cannot steer the connection elsewhere.
Through an egress proxy the tunnel goes to the checked address too (``media.egress`` says how
the environment's proxies and this guard work together). Residual risks: hosts in
``allowed_hosts`` are trusted by configuration and resolved at connect time (by the system, or
by the proxy), unpinned; a caller-supplied ``client`` routes as it was built (the media client,
``media.egress.new_media_client``, keeps no connection alive, so one opened to a pinned address
never carries another host's request).

Every step of a download runs under its overall deadline (``core.deadlines``): the resolution
of the name here (``core.dns``: a hung resolver ends at the deadline), each hop's connect and
headers, and every read of the body, however slowly it drips.

Messages name URLs with their query string redacted (``errors.redact_url``) because signed URLs
carry credentials there; caller headers (API keys) are never echoed and are dropped when a
redirect leaves the original origin.
"""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from recon_dagster.config import (
    Settings,
    authority,
    parse_allowed_hosts,
    settings,
)
from recon_dagster.core import dns
from recon_dagster.core.crashpoints import crash_point
from recon_dagster.core.deadlines import exchange_deadline, left_of_exchange, sized_deadline_s
from recon_dagster.media.egress import new_media_client
from recon_dagster.media.errors import (
    MediaExpired,
    MediaFetchError,
    MediaRefused,
    MediaTooLarge,
    redact_url,
)

MAX_REDIRECTS = 5
_REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})
_EXPIRED_CODES = frozenset({403, 404, 410})
_DEFAULT_PORTS = {"http": 80, "https": 443}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]

# Python 3.11's is_global misses a few ranges (multicast counts as global, NAT64 and
# 6to4 embed an IPv4 address), so those are checked explicitly.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


# --- policy (pure) ---------------------------------------------------------------------------


def allowed_hosts_from_env(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Hosts allowed past the address check, from ``RECON_MEDIA_ALLOWED_HOSTS`` (its syntax is
    ``config.parse_allowed_hosts``)."""
    return settings(environ).media_allowed_hosts


def host_is_allowed(host: str, port: int, allowed_hosts: Collection[str]) -> bool:
    """True when ``host`` (any port) or ``host:port`` is listed."""
    host = host.lower()
    return host in allowed_hosts or authority(host, port) in allowed_hosts


def is_public_address(address: str | IPAddress) -> bool:
    """True only for a globally routable unicast address (see the module docstring)."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return False
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is not None:
            return is_public_address(embedded)
        if ip in _NAT64:
            return False
    return ip.is_global and not (
        ip.is_multicast or ip.is_reserved or ip.is_loopback or ip.is_link_local or ip.is_private
    )


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order, within what is left of the
    thread's exchange deadline (``dns.ResolveTimeout`` past it)."""
    return dns.resolve(host, port, left_of_exchange(None, dns.ResolveTimeout))


@dataclass(frozen=True)
class Hop:
    """One checked request target: where to connect and what name to present."""

    url: httpx.URL  # the URL as given (named in messages, base for relative redirects)
    connect_url: httpx.URL  # same URL with the host replaced by the checked address, if pinned
    host_header: str | None  # original authority, sent as Host when pinned
    sni_hostname: str | None  # name for TLS SNI and certificate checks when pinned


def check_url(
    url: str | httpx.URL,
    allowed_hosts: Collection[str] = frozenset(),
    resolver: Resolver = system_resolver,
) -> Hop:
    """Apply the fetch policy to one URL; return where to connect or raise ``MediaRefused``.

    A host that does not resolve raises ``MediaFetchError`` (a network failure, not a policy one).
    """
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise MediaRefused(url, "not a valid URL") from None
    scheme = parsed.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise MediaRefused(url, f"scheme {scheme or '(none)'!r} is not allowed (https only)")
    if parsed.userinfo:
        raise MediaRefused(url, "credentials in the URL (userinfo) are not allowed")
    host = parsed.host
    if not host:
        raise MediaRefused(url, "URL has no host")
    port = parsed.port or _DEFAULT_PORTS[scheme]
    if host_is_allowed(host, port, allowed_hosts):
        return Hop(parsed, parsed, None, None)
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None and not is_public_address(literal):
        raise MediaRefused(url, f"address {literal} is not public")
    if scheme != "https":
        raise MediaRefused(
            url, f"plain http is only allowed for hosts listed in {Settings.media_allowed_hosts.name}"
        )

    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = resolver(parsed.raw_host.decode("ascii"), port)
        except (OSError, UnicodeError) as exc:
            raise MediaFetchError(url, f"cannot resolve host: {_describe(exc)}") from None
        if not addresses:
            raise MediaFetchError(url, "host resolved to no address")
    for address in addresses:
        try:
            public = is_public_address(address)
        except ValueError:
            public = False
        if not public:
            raise MediaRefused(url, f"host resolves to non-public address {address}")
    pinned = addresses[0]
    return Hop(
        url=parsed,
        connect_url=parsed.copy_with(host=pinned),
        host_header=parsed.netloc.decode("ascii"),
        sni_hostname=None if literal is not None else parsed.raw_host.decode("ascii"),
    )


def _same_origin(a: httpx.URL, b: httpx.URL) -> bool:
    return (a.scheme, a.host, a.port or _DEFAULT_PORTS.get(a.scheme)) == (
        b.scheme,
        b.host,
        b.port or _DEFAULT_PORTS.get(b.scheme),
    )


def _content_length(response: httpx.Response) -> int | None:
    value = response.headers.get("content-length")
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


# --- effects ---------------------------------------------------------------------------------


class MediaStream:
    """An open media response: metadata plus a capped chunk iterator (single use)."""

    def __init__(
        self,
        response: httpx.Response,
        url: httpx.URL,
        max_bytes: int,
        deadline: float | None = None,
        started: float | None = None,
    ) -> None:
        self._response = response
        self._deadline = deadline
        self._started = started
        self._url = url
        self.max_bytes = max_bytes
        self.url = redact_url(url)
        self.status_code = response.status_code
        self.content_type: str | None = response.headers.get("content-type")
        self.content_length: int | None = _content_length(response)
        # Checked by the caller (media.content): httpx would decode it at any ratio.
        self.content_encoding: str | None = response.headers.get("content-encoding")
        self.bytes_read = 0

    def iter_chunks(self, chunk_size: int | None = None) -> Iterator[bytes]:
        """Yield the body chunk by chunk; ``MediaTooLarge`` once more than ``max_bytes`` arrive.

        By default chunks are what the socket delivered (at most 64 KiB each); re-chunking to a
        fixed ``chunk_size`` costs copies (measured: 250 MB/s pass-through vs 175 MB/s at 64 KiB).
        """
        chunks = self._response.iter_bytes(chunk_size)
        try:
            while True:
                # Each read (not the consumer's work between reads) runs under the download's
                # deadline: a body dripped a byte at a time ends there, whatever the read timeout.
                with exchange_deadline(self._deadline, self._started):
                    chunk = next(chunks, None)
                if chunk is None:
                    return
                self.bytes_read += len(chunk)
                if self.bytes_read > self.max_bytes:
                    raise MediaTooLarge(self._url, self.max_bytes, self.bytes_read)
                if self._deadline is not None and time.monotonic() > self._deadline:
                    raise MediaFetchError(
                        self._url, f"download deadline passed after {self.bytes_read} bytes"
                    )
                yield chunk
                crash_point("media.mid_download")  # the consumer has written this chunk
        except httpx.HTTPError as exc:
            raise MediaFetchError(self._url, f"reading body failed: {_describe(exc)}") from None

    def __repr__(self) -> str:
        return f"MediaStream(url={self.url!r}, content_type={self.content_type!r}, content_length={self.content_length!r})"


def _describe(exc: BaseException, timeout_s: float | None = None) -> str:
    """Class name plus the error text, any query string in it redacted (TLS and socket reasons
    help operators; httpx texts rarely name the URL, but a signed query must never leak). A bare
    "timed out" names the timeout that ran out, when the caller knows it."""
    text = re.sub(r"\?\S*", "?<redacted>", str(exc))[:300]
    if timeout_s is not None and isinstance(exc, httpx.TimeoutException) and text.startswith("timed out"):
        text = f"no answer within the {timeout_s:.3g} s media timeout"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextmanager
def open_media_stream(
    url: str,
    *,
    max_bytes: int,
    allowed_hosts: Collection[str] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 30,
    client: httpx.Client | None = None,
    deadline_s: float | None = None,
    resolver: Resolver = system_resolver,
    min_bytes_per_s: float | None = None,
) -> Iterator[MediaStream]:
    """Open ``url`` under the fetch policy and yield a ``MediaStream`` (closed on exit).

    ``allowed_hosts`` defaults to ``allowed_hosts_from_env()``. ``headers`` (e.g. an API key for
    ElevenLabs byte endpoints) go only to the original origin. Raises ``MediaRefused``,
    ``MediaExpired`` (403/404/410), ``MediaTooLarge`` (declared length over the cap) or
    ``MediaFetchError``. ``timeout_s`` bounds each connect/read; ``deadline_s`` (optional) bounds
    the whole download against a server that drips bytes (checked per chunk; every connect and
    read timeout is cut to what is left of it, so the download ends by the deadline). With
    ``min_bytes_per_s``, an object that declares its length gets only ``MEDIA_FLOOR_S +
    length / min_bytes_per_s`` of it. ``resolver`` is for tests; ``client`` (default: a new
    ``media.egress.new_media_client()``, closed on exit) routes the hops.
    """
    if max_bytes < 0:
        raise ValueError("max_bytes must be >= 0")
    if allowed_hosts is None:
        allowed = allowed_hosts_from_env()
    elif isinstance(allowed_hosts, str):  # a bare "host:port" would otherwise become its letters
        allowed = parse_allowed_hosts(allowed_hosts)
    else:
        allowed = parse_allowed_hosts(",".join(allowed_hosts))
    started = time.monotonic()
    deadline = None if deadline_s is None else started + deadline_s
    own_client = client is None
    http = client or new_media_client()
    response: httpx.Response | None = None
    try:
        with exchange_deadline(deadline, started):
            response, final_url = _open(
                http,
                url,
                max_bytes,
                headers or {},
                timeout_s,
                lambda u: check_url(u, allowed, resolver),
                deadline,
            )
        if deadline_s is not None:
            share = sized_deadline_s(_content_length(response), deadline_s, min_bytes_per_s)
            deadline = started + share
        yield MediaStream(response, final_url, max_bytes, deadline, started)
    finally:
        if response is not None:
            response.close()
        if own_client:
            http.close()


def _open(
    http: httpx.Client,
    url: str,
    max_bytes: int,
    headers: Mapping[str, str],
    timeout_s: float,
    check: Callable[[str | httpx.URL], Hop],
    deadline: float | None = None,
) -> tuple[httpx.Response, httpx.URL]:
    """Send GET hop by hop, applying ``check`` (the fetch policy) to every URL before connecting."""
    first = check(url)
    hop = first
    for _ in range(MAX_REDIRECTS + 1):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MediaFetchError(hop.url, "download deadline passed before an answer")
            timeout_s = min(timeout_s, left)
        request_headers = {"accept-encoding": "identity", "user-agent": "recon-dagster-media"}
        if _same_origin(hop.url, first.url):
            request_headers.update({k.lower(): v for k, v in headers.items()})
        if hop.host_header is not None:
            request_headers["host"] = hop.host_header
        extensions = {"sni_hostname": hop.sni_hostname} if hop.sni_hostname else {}
        request = http.build_request(
            "GET", hop.connect_url, headers=request_headers, timeout=timeout_s, extensions=extensions
        )
        try:
            response = http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise MediaFetchError(hop.url, f"request failed: {_describe(exc, timeout_s)}") from None
        status = response.status_code
        if status in _REDIRECT_CODES:
            location = response.headers.get("location")
            response.close()
            if not location:
                raise MediaFetchError(hop.url, f"HTTP {status} redirect without Location", status)
            try:
                target = hop.url.join(location)
            except (httpx.InvalidURL, ValueError):
                raise MediaRefused(hop.url, "redirect to an invalid URL") from None
            try:
                hop = check(target)
            except MediaRefused as exc:
                raise MediaRefused(hop.url, f"redirect refused: {exc}") from None
            continue
        if status in _EXPIRED_CODES:
            response.close()
            raise MediaExpired(hop.url, status)
        if not 200 <= status < 300:
            response.close()
            raise MediaFetchError(hop.url, f"HTTP {status}", status)
        declared = _content_length(response)
        if declared is not None and declared > max_bytes:
            response.close()
            raise MediaTooLarge(hop.url, max_bytes, declared, declared=True)
        return response, hop.url
    raise MediaFetchError(first.url, f"more than {MAX_REDIRECTS} redirects")
