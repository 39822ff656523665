"""What every provider resource shares: config fields, the lazy HTTP client, the poll loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar, Self

import dagster as dg
import httpx
from pydantic import Field, PrivateAttr

from recon_dagster.config import Settings, limit_name
from recon_dagster.core.deadlines import poll_deadline_s, poll_max_bytes
from recon_dagster.core.kinds import ProviderKind, get_kind
from recon_dagster.core.redaction import register_secret
from recon_dagster.providers.create_marker import CreateLedgerHook
from recon_dagster.providers.http import HttpSettings, Limits, ProviderHttp, ProviderNotFound, json_body
from recon_dagster.providers.limits import account_limits_from_env
from recon_dagster.providers.observed_http import ObservedProviderHttp
from recon_dagster.providers.status import MediaRef, NotSent, ProviderError, UpstreamState, UpstreamStatus

ProgressCallback = Callable[[UpstreamStatus], None]
TaskCreatedCallback = Callable[[str], None]


class PollBudgetExceeded(ProviderError):
    """A poll loop ran out of its bounded budget while the task was still running upstream.

    The task is not lost: ``task_id`` can be resumed later (or reconciled).
    """

    def __init__(
        self, provider_kind: str, task_id: str, budget_s: float, last: UpstreamStatus | None
    ) -> None:
        super().__init__(
            f"{provider_kind}: task {task_id} still running after the {budget_s:g} s poll budget"
        )
        self.provider_kind = provider_kind
        self.task_id = task_id
        self.budget_s = budget_s
        self.last = last


class ProviderConfigError(ProviderError):
    """A provider resource is misconfigured (missing key, wrong kind for this resource...)."""


class _LazyClient:
    """Holds one resource instance's HTTP client, created on first use under a lock.

    Copies of the resource (pydantic ``model_copy``) share it; deep copies and pickles start empty,
    since a client, a socket pool and a lock cannot be copied.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.http: ProviderHttp | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> _LazyClient:
        return _LazyClient()

    def __reduce__(self) -> tuple[type[_LazyClient], tuple[()]]:
        return (_LazyClient, ())


def poll_until_terminal(
    poll: Callable[[], UpstreamStatus],
    *,
    provider_kind: str,
    task_id: str,
    interval_s: float,
    budget_s: float,
    on_progress: ProgressCallback | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> UpstreamStatus:
    """Poll until a terminal state, calling ``on_progress`` after each poll; bounded by ``budget_s``.

    A poll this process never sent (``NotSent``: its account's limiter held it back) is no answer:
    it is asked again when the limit expects to let it out (at least the interval), within the
    budget; past the budget the run ends resumable (``PollBudgetExceeded``), not as a poll error."""
    deadline = clock() + budget_s
    last: UpstreamStatus | None = None
    while True:
        try:
            last = poll()
        except NotSent as exc:
            remaining = deadline - clock()
            if remaining <= 0:
                raise PollBudgetExceeded(provider_kind, task_id, budget_s, last) from exc
            sleep(min(max(interval_s, exc.retry_in_s or 0.0), remaining))
            continue
        if on_progress is not None:
            on_progress(last)
        if last.terminal:
            return last
        remaining = deadline - clock()
        if remaining <= 0:
            raise PollBudgetExceeded(provider_kind, task_id, budget_s, last)
        sleep(min(interval_s, remaining))


def _resolve(value: str, what: str) -> str:
    """A config value that may still be an unresolved ``dg.EnvVar`` (resource used outside a run)."""
    if isinstance(value, dg.EnvVar):
        resolved = value.get_value()
        if not resolved:
            raise ProviderConfigError(f"{what}: environment variable {value.env_var_name} is not set")
        return resolved
    return value


class ProviderResource(dg.ConfigurableResource):  # type: ignore[type-arg]  # bare, as Dagster's own: its parameter is the resource itself
    """Config and HTTP plumbing common to the four provider resources."""

    base_url: str = Field(description="Provider API base URL (the sandbox's URL in tests).")
    api_key: str = Field(repr=False, description="API key; wire it as dg.EnvVar, never a literal.")
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    write_timeout_s: float = 30.0
    pool_timeout_s: float = 30.0
    max_attempts: int = Field(default=5, description="Attempts per call, first one included.")
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 120.0
    max_concurrency: int = Field(default=16, description="In-flight requests per process.")
    create_rate_per_s: float | None = Field(default=None, description="Creates per second; None: no limit.")
    create_burst: int = 1
    read_rate_per_s: float | None = Field(default=None, description="Polls/reads per second; None: no limit.")
    read_burst: int = 1
    read_deadline_s: float | None = Field(
        default=None,
        description="Total seconds of one poll or read, retries included; None: "
        f"{Settings.poll_deadline_s.name} ({Settings.poll_deadline_s.default:g}).",
    )
    max_body_bytes: int | None = Field(
        default=None,
        description=f"Decoded size cap of one answer; None: {Settings.poll_max_bytes.name} (8 MiB).",
    )
    shared_limits: bool = Field(
        default=False,
        description=f"Share the account budget ({limit_name('<PROVIDER>')}) with every process through "
        "the app's PostgreSQL; False: per-process limits only.",
    )

    _lazy: _LazyClient = PrivateAttr(default_factory=_LazyClient)

    PROVIDER: ClassVar[str]

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if name != "api_key":
                yield name, value

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; one that changes a field builds its own client (the original's was made with the
        original's URL, key and limits), one that changes nothing shares it."""
        copy = super().model_copy(update=update, deep=deep)
        if update:
            copy._lazy = _LazyClient()
        return copy

    # -- hooks --------------------------------------------------------------------------------

    def _auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"}

    def _error_message(self, response: httpx.Response) -> str | None:
        raise NotImplementedError

    def _envelope_check(self, response: httpx.Response) -> tuple[int, str] | None:
        return None

    # -- plumbing -----------------------------------------------------------------------------

    def resolved_base_url(self) -> str:
        return _resolve(self.base_url, f"{self.PROVIDER} base_url").rstrip("/")

    def _settings(self) -> HttpSettings:
        return HttpSettings(
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            write_timeout_s=self.write_timeout_s,
            pool_timeout_s=self.pool_timeout_s,
            max_attempts=self.max_attempts,
            backoff_initial_s=self.backoff_initial_s,
            backoff_max_s=self.backoff_max_s,
            retry_after_max_s=self.retry_after_max_s,
            read_deadline_s=self.read_deadline_s if self.read_deadline_s is not None else poll_deadline_s(),
            max_body_bytes=self.max_body_bytes if self.max_body_bytes is not None else poll_max_bytes(),
            limits=Limits(
                max_concurrency=self.max_concurrency,
                create_rate_per_s=self.create_rate_per_s,
                create_burst=self.create_burst,
                read_rate_per_s=self.read_rate_per_s,
                read_burst=self.read_burst,
            ),
            account=account_limits_from_env(str(self.PROVIDER)) if self.shared_limits else None,
        )

    @property
    def http(self) -> ProviderHttp:
        """This instance's pooled client, created on first use (thread-safe)."""
        lazy = self._lazy
        if lazy.http is None:
            with lazy.lock:
                if lazy.http is None:
                    raw = _resolve(self.api_key, f"{self.PROVIDER} api_key")
                    # Masked in every form before anything can echo it; a key read from a file
                    # or a secret store often ends in a newline, which no header may carry.
                    register_secret(raw)
                    key = raw.strip()
                    if not key:
                        raise ProviderConfigError(f"{self.PROVIDER} api_key is blank")
                    lazy.http = ObservedProviderHttp(
                        provider=str(self.PROVIDER),
                        base_url=self.resolved_base_url(),
                        auth_headers=self._auth_headers(key),
                        secret=key,
                        settings=self._settings(),
                        error_message=self._error_message,
                        envelope_check=self._envelope_check,
                    )
        return lazy.http

    def close(self) -> None:
        """Close the pooled client (a later call opens a new one)."""
        with self._lazy.lock:
            if self._lazy.http is not None:
                self._lazy.http.close()
                self._lazy.http = None

    def _kind(self, kind: str, *, is_async: bool = True) -> ProviderKind:
        """The registry row of ``kind``, checked to be served by this resource."""
        pk = get_kind(kind)
        if pk.provider != self.PROVIDER:
            raise ProviderConfigError(f"{kind} is served by the {pk.provider} resource, not {self.PROVIDER}")
        if is_async and not pk.is_async:
            raise ProviderConfigError(f"{kind} is synchronous: it has no task to create, poll or resume")
        return pk

    @staticmethod
    def _check_payload(kind: str, payload: object, required: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise ValueError(f"{kind}: payload must be a dict, got {type(payload).__name__}")
        missing = [k for k in required if k not in payload]
        if missing:
            raise ValueError(f"{kind}: payload is missing {', '.join(missing)}")
        return payload

    # -- media --------------------------------------------------------------------------------

    def _owns(self, url: str) -> bool:
        base = httpx.URL(self.resolved_base_url())
        try:
            target = httpx.URL(url)
        except httpx.InvalidURL:
            return False
        same_origin = (target.scheme, target.host, target.port) == (base.scheme, base.host, base.port)
        return same_origin and target.path.startswith(base.path.rstrip("/") + "/")

    def media_headers(self, ref: MediaRef) -> dict[str, str]:
        """Headers the media downloader adds to fetch ``ref``: the API key for this provider's own
        byte endpoints (``needs_auth``), nothing otherwise. Refuses to send the key elsewhere."""
        if not ref.needs_auth:
            return {}
        if not self._owns(ref.url):
            raise ProviderConfigError(
                f"media {ref.url!r} needs auth but is not on the {self.PROVIDER} API host; key withheld"
            )
        return self.http.auth_headers

    @contextmanager
    def media_slot(self, ref: MediaRef) -> Iterator[None]:
        """Held while ``ref`` downloads: for this provider's own byte endpoints (``needs_auth``)
        the account's read token and a concurrency slot, like a poll's (the download is a request
        on the account's key; not let out in time: ``NotSent``, nothing fetched); nothing for a
        public URL, which is not the account's traffic."""
        if not ref.needs_auth:
            yield
            return
        with self.http.hold_read(str(self.PROVIDER)):
            yield

    @contextmanager
    def open_media(self, ref: MediaRef) -> Iterator[httpx.Response]:
        """Stream an authenticated media endpoint of this provider (``needs_auth`` refs only)."""
        if not ref.needs_auth:
            raise ProviderConfigError(f"{ref.url!r} is a public URL: fetch it with the media downloader")
        if not self._owns(ref.url):  # the key goes to this provider's own API host only
            raise ProviderConfigError(
                f"media {ref.url!r} needs auth but is not on the {self.PROVIDER} API host; key withheld"
            )
        with self.http.stream(ref.url, label=str(self.PROVIDER)) as response:
            yield response


class AsyncProviderResource(ProviderResource):
    """A provider resource with async kinds: create, poll, run (create + poll), resume."""

    def create(self, kind: str, payload: dict[str, Any]) -> str:
        """Start an upstream task; returns its task id."""
        raise NotImplementedError

    def mark_request(self, kind: str, payload: dict[str, Any], marker: str) -> dict[str, Any] | None:
        """``payload`` carrying the create ledger's job marker where this provider echoes it back,
        or None when it has no place for one (the request is then sent unmarked)."""
        return None

    def _create_recorded(self, kind: str, payload: dict[str, Any], on_task_created: object) -> str:
        """``create``, recorded in the create ledger before it is sent when the callback keeps one
        (the worker library's); a create that raised is recorded as ambiguous or refused."""
        if not isinstance(on_task_created, CreateLedgerHook):
            return self.create(kind, payload)
        markable = self.mark_request(kind, payload, "") is not None
        marker = on_task_created.before_send(str(self.PROVIDER), kind, payload, markable)
        marked = self.mark_request(kind, payload, marker) if markable else None
        try:
            return self.create(kind, payload if marked is None else marked)
        except BaseException as exc:
            on_task_created.unanswered(exc)
            raise

    def poll(self, kind: str, task_id: str) -> UpstreamStatus:
        """One poll of an existing task."""
        raise NotImplementedError

    def _poll_get(self, kind: str, path: str, task_id: str, params: dict[str, str] | None = None) -> Any:
        """GET a task's status body; a provider-shaped 404 becomes a ``not_found`` status."""
        try:
            response = self.http.request("GET", path, label=kind, idempotent=True, params=params)
        except ProviderNotFound as exc:
            return UpstreamStatus(
                provider_kind=kind, task_id=task_id, state=UpstreamState.NOT_FOUND, error=str(exc)
            )
        return json_body(kind, response)

    def run(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        on_task_created: TaskCreatedCallback | None = None,
        on_progress: ProgressCallback | None = None,
        poll_interval_s: float | None = None,
        budget_s: float | None = None,
    ) -> UpstreamStatus:
        """Create, hand the task id to ``on_task_created`` (exactly once, before the first poll),
        then poll until terminal within the kind's budget.

        If ``on_task_created`` raises, nothing is polled and the error propagates: the task exists
        upstream but was not recorded, which only the caller can decide about.
        """
        self._kind(kind)
        task_id = self._create_recorded(kind, payload, on_task_created)
        if on_task_created is not None:
            on_task_created(task_id)
        return self.resume(
            kind, task_id, on_progress=on_progress, poll_interval_s=poll_interval_s, budget_s=budget_s
        )

    def resume(
        self,
        kind: str,
        task_id: str,
        *,
        on_progress: ProgressCallback | None = None,
        poll_interval_s: float | None = None,
        budget_s: float | None = None,
    ) -> UpstreamStatus:
        """Poll an existing task until terminal; never creates one."""
        pk = self._kind(kind)
        if not isinstance(task_id, str) or not task_id:
            raise ValueError(f"{kind}: task_id must be a non-empty string, got {task_id!r}")
        return poll_until_terminal(
            lambda: self.poll(kind, task_id),
            provider_kind=kind,
            task_id=task_id,
            interval_s=pk.poll_interval_s if poll_interval_s is None else poll_interval_s,
            budget_s=pk.poll_budget.total_seconds() if budget_s is None else budget_s,
            on_progress=on_progress,
        )
