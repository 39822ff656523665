"""HTTP behaviour shared by every provider client, written once.

Timeouts on every call; 429/5xx (and KIE's in-envelope throttling codes) retried with capped
exponential backoff and jitter, honouring ``Retry-After``; connection errors retried for idempotent
calls; a non-idempotent call (a create, a billed sync call) is re-sent only when it certainly did
not reach the provider. Per-provider concurrency (semaphore) and rate (token bucket) limits are
shared by every thread of the process. The API key never appears in an error, a log line or a repr.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import tenacity

from recon_dagster.core.deadlines import (
    DEFAULT_POLL_DEADLINE_S,
    DEFAULT_POLL_MAX_BYTES,
    exchange_deadline,
    guard_transports,
)
from recon_dagster.core.proxy import proxy_settings
from recon_dagster.core.redaction import redact_secrets
from recon_dagster.core.tls import shared_tls_context
from recon_dagster.providers.limits import AccountLimits, account_limiter
from recon_dagster.providers.process_limits import Limits as Limits  # re-exported: its old home
from recon_dagster.providers.process_limits import TokenBucket as TokenBucket  # re-exported
from recon_dagster.providers.process_limits import shared_limiter
from recon_dagster.providers.status import (
    AmbiguousCreateError,
    NotSent,
    NotSentReason,
    ProviderHTTPError,
    ProviderProtocolError,
)

log = logging.getLogger("recon_dagster.providers.http")

# Statuses that mean "not accepted, try again later". 504 is not here for non-idempotent calls:
# a gateway timeout says the upstream may still be working on the request (see ``_classify``).
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504, 529})
AMBIGUOUS_CREATE_STATUSES = frozenset({504})

# Failures that happen before a single byte of the request left this process (a proxy that
# refuses the tunnel never passes the request on either).
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError)
# What each timeout means, for the reason a person reads: (httpx's timeout key, what did not happen).
_TIMEOUT_PHASES: dict[type[Exception], tuple[str, str]] = {
    httpx.ConnectTimeout: ("connect", "no connection"),
    httpx.ReadTimeout: ("read", "no answer"),
    httpx.WriteTimeout: ("write", "request not sent"),
    httpx.PoolTimeout: ("pool", "no free connection"),
}
# Errors in our own configuration (a base URL without a scheme...): retrying cannot help.
_CONFIG_ERRORS = (httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.LocalProtocolError)


class RetryableError(ProviderHTTPError):
    """An answer that means "not accepted, try again" (429, 5xx, KIE in-envelope codes)."""

    def __init__(
        self, label: str, status_code: int | None, message: str, retry_after_s: float | None
    ) -> None:
        super().__init__(label, status_code, message)
        self.retry_after_s = retry_after_s


class ProviderNotFound(ProviderHTTPError):
    """HTTP 404 answered in the provider's own error shape: the API is reachable and says it does
    not know the object. (A 404 page from a wrong base URL is a plain ``ProviderHTTPError``.)"""


class _Transient(ProviderHTTPError):
    """A transport failure that is safe to retry (the request was not sent, or is idempotent)."""

    def __init__(self, label: str, detail: str) -> None:
        super().__init__(label, None, detail)
        self.label = label
        self.detail = detail


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


def redact(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` and every registered key masked in all their forms (stripped,
    URL-encoded, repr-escaped): providers and gateways sometimes echo a bad key."""
    if secret and secret in text:
        text = text.replace(secret, "[redacted]")
    return redact_secrets(text)


def json_body(kind: str, response: httpx.Response) -> Any:
    """The JSON of a 2xx answer, or a ``ProviderProtocolError`` that shows what came instead."""
    try:
        return response.json()
    except ValueError:
        snippet = redact_secrets(response.text)[:120]
        raise ProviderProtocolError(
            kind, f"HTTP {response.status_code} answer is not JSON: {snippet!r}"
        ) from None


ErrorMessage = Callable[[httpx.Response], str | None]
EnvelopeCheck = Callable[[httpx.Response], tuple[int, str] | None]


def generic_error_message(response: httpx.Response) -> str:
    """A short description of an error answer when the provider's own shape is not recognised."""
    # Masked before it is cut, so a cut never leaves half a key.
    text = redact_secrets(response.text).strip().replace("\n", " ")
    return text[:300] or response.reason_phrase or "no body"


@dataclass(frozen=True)
class HttpSettings:
    """Timeouts, retry policy and limits of one provider client."""

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    write_timeout_s: float = 30.0
    pool_timeout_s: float = 30.0
    max_attempts: int = 5
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    # A Retry-After beyond this is capped: a worker must not sleep for an hour inside one call.
    retry_after_max_s: float = 120.0
    limits: Limits = field(default_factory=Limits)
    # Total time of one idempotent call (poll, read), retries included; a server dripping bytes
    # never trips a per-read timeout. None: no overall deadline. Creates and billed sync calls
    # have none (an LLM answer may take minutes; cutting a create short would make it ambiguous).
    read_deadline_s: float | None = DEFAULT_POLL_DEADLINE_S
    # Decoded size of one idempotent call's answer (inflated step by step: a gzip bomb stops here).
    max_body_bytes: int = DEFAULT_POLL_MAX_BYTES
    # The account budget shared by every process (providers/limits.py); None: per-process only.
    account: AccountLimits | None = None


# Encodings decoded here, step by step with a bound on each step's output (httpx's own decoder
# inflates a whole network chunk at once: 64 KiB of a gzip bomb is 64 MiB).
ACCEPT_ENCODING = "gzip, deflate"
_UNCAPPED = 1 << 62


def _bounded_decode(response: httpx.Response, cap: int, label: str) -> Iterator[bytes]:
    """The decoded body of a streamed response, never inflating more than ``cap + 1`` bytes at
    once; an encoding this client did not offer is an error, and a compressed body that stops
    before its stream's end (its framing intact: a close-delimited answer cut short, or a proxy
    that cut it) is ``httpx.RemoteProtocolError``, like a body shorter than its Content-Length."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        yield from response.iter_raw()
        return
    if encoding in ("gzip", "x-gzip"):
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        inflater = zlib.decompressobj()
    else:
        raise ProviderHTTPError(label, response.status_code, f"answer in unsupported encoding {encoding!r}")
    received = 0
    try:
        for raw in response.iter_raw():
            received += len(raw)
            data = raw
            while data:
                out = inflater.decompress(data, cap + 1)
                yield out
                data = inflater.unconsumed_tail
        yield inflater.flush()
    except zlib.error as exc:
        raise ProviderHTTPError(
            label, response.status_code, f"answer is not valid {encoding}: {exc}"
        ) from None
    if received and not inflater.eof:
        # zlib reports no error for a stream that merely stops: only its end (gzip's CRC and
        # length, deflate's checksum) shows the answer is whole.
        raise httpx.RemoteProtocolError(
            f"answer's {encoding} stream ends before its end ({received} bytes received): truncated"
        )


class ProviderHttp:
    """One provider's HTTP client: pooled, thread-safe, with the shared retry and limit policy."""

    def __init__(
        self,
        provider: str,
        base_url: str,
        auth_headers: Mapping[str, str],
        secret: str,
        settings: HttpSettings,
        error_message: ErrorMessage,
        envelope_check: EnvelopeCheck | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self.settings = settings
        self._auth = dict(auth_headers)
        self._secret = secret
        self._error_message = error_message
        self._envelope_check = envelope_check
        self._sleep = sleep
        self._limiter = shared_limiter(provider, self.base_url, settings.limits)
        self._account = account_limiter(settings.account)
        with proxy_settings():  # a proxy URL's password is a secret like the API key
            self.client = self._new_client(settings)
        # Headers dripped a line at a time reset every per-read timeout, and a name's resolution
        # takes no timeout at all: bound every step of every exchange, the proxies' included.
        guard_transports(self.client)

    def _new_client(self, s: HttpSettings) -> httpx.Client:
        """The client: pooled, the process's TLS context, the environment's proxies."""
        return httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(
                connect=s.connect_timeout_s,
                read=s.read_timeout_s,
                write=s.write_timeout_s,
                pool=s.pool_timeout_s,
            ),
            limits=httpx.Limits(
                max_connections=s.limits.max_concurrency, max_keepalive_connections=s.limits.max_concurrency
            ),
            follow_redirects=False,
            verify=shared_tls_context(),  # the CA bundle loaded once per process, not per client
            # No transport= here: httpx then routes through HTTP_PROXY / HTTPS_PROXY / ALL_PROXY
            # and honours NO_PROXY, as it reads them from the environment (trust_env).
        )

    def __repr__(self) -> str:
        return f"ProviderHttp(provider={self.provider!r}, base_url={self.base_url!r})"

    def close(self) -> None:
        self.client.close()

    @property
    def auth_headers(self) -> dict[str, str]:
        return dict(self._auth)

    # -- the one request path ----------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        label: str,
        idempotent: bool,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send one logical request under the retry policy; returns a 2xx response (body read).

        ``label`` (a provider_kind, or the provider's name) names the call in errors and logs.
        ``idempotent=False`` marks a create or a billed call: never re-sent once it may have
        reached the provider; a lost answer raises ``AmbiguousCreateError``. An idempotent call
        ends within ``settings.read_deadline_s`` however the server paces its bytes.
        """
        limit = self.settings.read_deadline_s if idempotent else None
        deadline = time.monotonic() + limit if limit else None

        def wait(state: tenacity.RetryCallState) -> float:
            planned = self._wait(state)
            return planned if deadline is None else min(planned, max(0.0, deadline - time.monotonic()))

        def stop(state: tenacity.RetryCallState) -> bool:
            if deadline is not None and time.monotonic() >= deadline:
                return True
            return state.attempt_number >= max(1, self.settings.max_attempts)

        # Set once a try of this request reaches the transport: a later try the limiter refuses
        # (``NotSent``) does not make the request unsent (its first try may have been answered).
        sent: list[bool] = []
        retrying = tenacity.Retrying(
            stop=stop,
            wait=wait,
            retry=tenacity.retry_if_exception_type((RetryableError, _Transient)),
            before_sleep=lambda state: self._log_retry(method, path, label, state),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            return retrying(
                self._attempt, method, path, label, idempotent, json, params, headers, deadline, sent
            )
        except NotSent as exc:
            if sent:
                raise ProviderHTTPError(label, None, f"{method} {path}: sent, then {exc}") from None
            raise
        except _Transient as exc:
            # Exhausted: report as a plain HTTP-level failure without retry internals.
            if deadline is not None and time.monotonic() >= deadline:
                raise ProviderHTTPError(
                    exc.label,
                    None,
                    f"{method} {path}: no answer within the {limit:g} s poll deadline ({exc.detail})",
                ) from None
            raise ProviderHTTPError(exc.label, None, exc.detail) from None

    def _attempt(
        self,
        method: str,
        path: str,
        label: str,
        idempotent: bool,
        json: Any,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str] | None,
        deadline: float | None = None,
        sent: list[bool] | None = None,
    ) -> httpx.Response:
        # The account's shared budget (when configured) is the rate limit; the process's own
        # bucket is the whole rate limit only without one (``RECON_LIMITS=process``).
        bucket = self._limiter.read_bucket if idempotent else self._limiter.create_bucket
        if self._account is None:
            self._wait_out_process_block(label, deadline)
        if bucket is not None and self._account is None:
            self._take_process_token(bucket, label, deadline)
        all_headers = {"accept-encoding": ACCEPT_ENCODING, **self._auth, **(headers or {})}
        started = time.perf_counter()
        account = (
            self._account.request(label, create=not idempotent, deadline=deadline)
            if self._account
            else nullcontext()
        )
        timeout: httpx.Timeout | None = None  # the one in effect, for a timeout's message
        try:
            with account, self._process_slot(label, deadline):
                if sent is not None:
                    sent.append(True)
                timeout = self._timeout_until(deadline)
                response = self._send_capped(
                    method, path, label, idempotent, deadline,
                    self.client.build_request(
                        method, path, json=json, params=params, headers=all_headers, timeout=timeout,
                    ),
                )  # fmt: skip
        except _NOT_SENT as exc:
            raise _Transient(label, f"{method} {path}: {self._transport_failure(exc, timeout)}") from None
        except _CONFIG_ERRORS as exc:
            raise ProviderHTTPError(label, None, f"{method} {path}: {self._clean(exc)}") from None
        except httpx.TransportError as exc:
            detail = f"{method} {path}: {self._transport_failure(exc, timeout)}"
            if not idempotent:
                raise AmbiguousCreateError(
                    f"{label}: the request may have reached {self.provider} but its answer was lost "
                    f"({detail}); not re-sent, to avoid a second billed task"
                ) from None
            raise _Transient(label, detail) from None
        log.debug(
            "%s %s %s -> %s in %.1f ms",
            label,
            method,
            path,
            response.status_code,
            (time.perf_counter() - started) * 1000,
        )
        try:
            return self._classify(response, method, path, label, idempotent)
        except RetryableError as exc:
            if exc.retry_after_s:
                # The provider throttles the account: everyone sharing it waits, not only us (every
                # process through the shared budget; without one, every thread of this process).
                seconds = min(exc.retry_after_s, self.settings.retry_after_max_s)
                (self._account or self._limiter).block_for(seconds)
            raise

    def _wait_out_process_block(self, label: str, deadline: float | None) -> None:
        """``RECON_LIMITS=process``: a Retry-After this process heard holds every request to the
        account until it ends; one whose deadline comes first is not sent."""
        blocked = self._limiter.blocked_s()
        if blocked <= 0:
            return
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and blocked > left:
            raise NotSent(
                label, NotSentReason.LIMITER_REFUSED,
                f"{self.provider}: the provider's Retry-After blocks this process's requests for "
                f"{blocked:.1f} s, past the request's deadline ({max(left, 0.0):.1f} s left); not sent",
                retry_in_s=blocked,
            )  # fmt: skip
        self._sleep(blocked)

    @contextmanager
    def _process_slot(self, label: str, deadline: float | None) -> Iterator[None]:
        """One of the process's ``max_concurrency`` request slots, waited for only until
        ``deadline``: a request still waiting then is not sent (``NotSent``), never sent late."""
        semaphore = self._limiter.semaphore
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not semaphore.acquire(timeout=left):
            raise NotSent(
                label, NotSentReason.SLOT_WAIT,
                f"{self.provider}: no request slot of this process (max_concurrency="
                f"{self.settings.limits.max_concurrency}) came free before the request's deadline "
                f"({left or 0.0:.1f} s left); not sent",
            )  # fmt: skip
        try:
            yield
        finally:
            semaphore.release()

    def _take_process_token(self, bucket: TokenBucket, label: str, deadline: float | None) -> None:
        """The process's token, waited for only until ``deadline``: a later one is not taken and
        the request is not sent (``NotSent``), so refusals never push the next token out."""
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        wait = bucket.reserve(max_wait=left)
        if wait is None:
            next_s = bucket.next_token_s()
            raise NotSent(
                label, NotSentReason.TOKEN_WAIT,
                f"{self.provider}: the next token of this process comes in {next_s:.1f} s, after the "
                f"request's deadline ({left or 0.0:.1f} s left); not waited for",
                retry_in_s=next_s,
            )  # fmt: skip
        if wait > 0:
            self._sleep(wait)

    def _transport_failure(self, exc: httpx.TransportError, timeout: httpx.Timeout | None) -> str:
        """A transport failure in words: a timeout names the timeout that ran out and its length
        (the overall poll deadline says so itself), anything else keeps its own message."""
        name = type(exc).__name__
        text = self._clean(exc)
        phase = _TIMEOUT_PHASES.get(type(exc))
        if phase is None or not text.startswith("timed out"):
            return f"{name}: {text}"
        limit = getattr(timeout, phase[0], None)
        within = f" within the {limit:.3g} s {phase[0]} timeout" if isinstance(limit, int | float) else ""
        return f"{phase[1]}{within} ({name})"

    def _timeout_until(self, deadline: float | None) -> httpx.Timeout:
        """The client's timeouts, each cut to what is left before ``deadline``."""
        s = self.settings
        left = float("inf") if deadline is None else max(0.001, deadline - time.monotonic())
        return httpx.Timeout(
            connect=min(s.connect_timeout_s, left),
            read=min(s.read_timeout_s, left),
            write=min(s.write_timeout_s, left),
            pool=min(s.pool_timeout_s, left),
        )

    def _send_capped(
        self,
        method: str,
        path: str,
        label: str,
        idempotent: bool,
        deadline: float | None,
        request: httpx.Request,
    ) -> httpx.Response:
        """Send and read the answer, counting decoded bytes against ``max_body_bytes`` and the
        clock against ``deadline``; returns a response whose body is read."""
        # Creates and billed sync calls are not capped: a text-to-speech answer is the audio itself.
        cap = self.settings.max_body_bytes if idempotent else _UNCAPPED
        started = None if deadline is None else deadline - (self.settings.read_deadline_s or 0.0)
        with exchange_deadline(deadline, started):
            return self._read_capped(method, path, label, deadline, request, cap)

    def _read_capped(
        self, method: str, path: str, label: str, deadline: float | None, request: httpx.Request, cap: int
    ) -> httpx.Response:
        response = self.client.send(request, stream=True)
        try:
            chunks: list[bytes] = []
            size = 0
            for chunk in _bounded_decode(response, cap, label):
                size += len(chunk)
                if size > cap:
                    problem = f"{method} {path}: answer larger than {cap} bytes decoded; refused"
                    raise ProviderHTTPError(label, response.status_code, problem)
                if deadline is not None and time.monotonic() > deadline:
                    limit = self.settings.read_deadline_s or 0.0
                    waited = time.monotonic() - deadline + limit
                    raise ProviderHTTPError(
                        label,
                        None,
                        f"{method} {path}: answer still arriving at the {limit:g} s poll deadline "
                        f"({size} bytes; waited {waited:.1f} s)",
                    )
                chunks.append(chunk)
        finally:
            response.close()
        # The body is decoded already: the copy must not claim an encoding or an old length.
        dropped = {"content-encoding", "content-length", "transfer-encoding"}
        return httpx.Response(
            response.status_code,
            headers=[(k, v) for k, v in response.headers.multi_items() if k.lower() not in dropped],
            content=b"".join(chunks),
            request=request,
            extensions={
                k: v for k, v in response.extensions.items() if k in ("http_version", "reason_phrase")
            },
        )

    def _classify(
        self, response: httpx.Response, method: str, path: str, label: str, idempotent: bool
    ) -> httpx.Response:
        status = response.status_code
        if 200 <= status < 300:
            if self._envelope_check is not None:
                soft = self._envelope_check(response)
                if soft is not None:
                    code, message = soft
                    retry_after = parse_retry_after(response.headers.get("retry-after"))
                    raise RetryableError(label, code, self._clean(message), retry_after)
            return response
        provider_message = self._error_message(response)
        message = self._clean(provider_message or generic_error_message(response))
        if not idempotent and status in AMBIGUOUS_CREATE_STATUSES:
            raise AmbiguousCreateError(
                f"{label}: {method} {path} got HTTP {status} ({message}); the provider may still "
                "have accepted it, so it is not re-sent"
            )
        if status in RETRYABLE_STATUSES:
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            raise RetryableError(label, status, message, retry_after)
        if status == 404 and provider_message:
            raise ProviderNotFound(label, status, message)
        raise ProviderHTTPError(label, status, message)

    # -- retry policy ------------------------------------------------------------------------

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """Retry-After when the provider gave one (plus a little jitter), else capped exponential."""
        s = self.settings
        exc = state.outcome.exception() if state.outcome else None
        retry_after: float | None = getattr(exc, "retry_after_s", None)
        if retry_after is not None:
            honoured = min(retry_after, s.retry_after_max_s)
            return honoured + random.uniform(0, min(1.0, 0.1 * honoured))
        ceiling = min(s.backoff_max_s, s.backoff_initial_s * (2.0 ** (state.attempt_number - 1)))
        # "Equal jitter": at least half the exponential step, so retries still back off.
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    def _log_retry(self, method: str, path: str, label: str, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.warning(
            "%s %s %s attempt %d failed (%s); retrying in %.2f s",
            label,
            method,
            path,
            state.attempt_number,
            exc,
            wait,
        )

    def _clean(self, value: object) -> str:
        return redact(str(value), self._secret)

    @contextmanager
    def hold_read(self, label: str) -> Iterator[None]:
        """A poll's hold (account token and slot, a process slot) for a read sent outside
        ``request`` (a media download from this API), for as long as it lasts; not let out by
        the read deadline: ``NotSent``."""
        limit = self.settings.read_deadline_s
        deadline = time.monotonic() + limit if limit else None
        held = (
            self._account.request(label, create=False, deadline=deadline) if self._account else nullcontext()
        )
        with held, self._process_slot(label, deadline):
            yield

    # -- streaming (authenticated media) -------------------------------------------------------

    @contextmanager
    def stream(self, url: str, *, label: str) -> Iterator[httpx.Response]:
        """Open an authenticated streaming GET on this provider's own host (no retries: the
        media downloader owns retry and size policy). Like a poll, it waits for the account (its
        read token and a concurrency slot, held while the body streams) and for one of the
        process's slots only until the read deadline; not let out by then: ``NotSent``."""
        try:
            with (
                self.hold_read(label),
                # Media comes as it is (identity): a compressed body cut short would decode as a
                # whole, shorter file, while a cut identity body fails against its Content-Length.
                self.client.stream(
                    "GET", url, headers={**self._auth, "accept-encoding": "identity"}
                ) as response,
            ):
                if response.status_code >= 400:
                    response.read()
                    message = self._clean(self._error_message(response) or generic_error_message(response))
                    raise ProviderHTTPError(label, response.status_code, message)
                encoding = response.headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    raise ProviderHTTPError(
                        label, response.status_code, f"media in {encoding!r}, not asked for"
                    )
                yield response
        except httpx.TransportError as exc:
            raise ProviderHTTPError(
                label, None, f"GET media: {type(exc).__name__}: {self._clean(exc)}"
            ) from None
