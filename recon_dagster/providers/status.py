"""One typed answer for every provider's poll: ``UpstreamStatus``."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from recon_dagster.core.redaction import redact_secrets


class UpstreamState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    # The task finished but its media is gone (Replicate data_removed, Runway expireFlag=1).
    EXPIRED = "expired"
    # The provider does not know the task id (KIE "recordInfo is null", HTTP 404).
    NOT_FOUND = "not_found"


class MediaRef(BaseModel):
    """Where a finished task's output can be fetched.

    ``url`` is a provider-signed URL, or for ElevenLabs a byte endpoint on the provider's own API
    that needs the API key (``needs_auth``).
    """

    model_config = ConfigDict(frozen=True)

    url: str
    kind: str = "file"  # image | video | audio | weights | file
    needs_auth: bool = False


class UpstreamStatus(BaseModel):
    model_config = ConfigDict(frozen=True)

    provider_kind: str
    task_id: str | None = None
    state: UpstreamState
    media: tuple[MediaRef, ...] = ()
    # Provider-reported cost in USD where the provider reports one.
    cost_usd: float | None = None
    # Text results (KIE resultObject, LLM output) where there is no media.
    result: dict[str, Any] | None = None
    error: str | None = None
    # Provider-reported progress 0-100 where known.
    progress: int | None = None
    # Provider-reported compute seconds where reported (Replicate metrics.predict_time).
    predict_time_s: float | None = None
    # What a running task is doing upstream, in words ("in queue at fal, position 3"): said in the
    # attempt's detail (the story, stuck_jobs, a force-fail's reason) instead of "still running".
    stage: str | None = None
    raw: dict[str, Any] | None = Field(default=None, repr=False)

    @property
    def terminal(self) -> bool:
        return self.state is not UpstreamState.RUNNING


class ProviderError(Exception):
    """Base of every error raised by a provider client; its message never carries a key (every
    registered secret is masked when the error is built, whatever path built it)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact_secrets(a) if isinstance(a, str) else a for a in args))


class ProviderProtocolError(ProviderError):
    """A provider answered with a body we cannot interpret; never guessed around."""

    def __init__(self, provider_kind: str, message: str) -> None:
        super().__init__(f"{provider_kind}: {message}")
        self.provider_kind = provider_kind


class ProviderHTTPError(ProviderError):
    """A provider call failed at the HTTP level after the retry policy gave up."""

    def __init__(self, provider_kind: str, status_code: int | None, message: str) -> None:
        # No status: nothing was answered (a timeout, a refused connection), so no "HTTP None".
        status = f"HTTP {status_code}: " if status_code is not None else ""
        super().__init__(f"{provider_kind}: {status}{message}")
        self.provider_kind = provider_kind
        self.status_code = status_code


class NotSentReason(StrEnum):
    """Why this process never sent a request (``NotSent``); recorded with the job's ``not_sent``
    outcome, and in ``explain`` and ``status``."""

    # The account is blocked by a provider's Retry-After until after the request's deadline.
    LIMITER_REFUSED = "limiter_refused"
    # The account's next rate token comes after the request's deadline (or the run's lease).
    TOKEN_WAIT = "token_wait_past_deadline"
    # No concurrency slot of the account came free before the request's deadline.
    SLOT_WAIT = "slot_wait_past_deadline"
    # The shared limiter could not reach its tables in PostgreSQL: it fails closed.
    LIMITER_DB = "limiter_database_unreachable"


class NotSent(ProviderHTTPError):
    """This process never sent the request: its own limiter refused it, or its deadline
    ran out while it waited for a token or a slot. Nothing reached the provider, so the caller may
    send it again later; reconciliation reschedules the job without counting an attempt.

    ``retry_in_s``: when the refusing limit expects to let a request out again (None: unknown)."""

    def __init__(
        self, provider_kind: str, reason: NotSentReason, message: str, retry_in_s: float | None = None
    ) -> None:
        ProviderError.__init__(self, f"{provider_kind}: not sent ({reason.value}): {message}")
        self.provider_kind = provider_kind
        self.status_code = None
        self.reason = reason
        self.retry_in_s = retry_in_s


class AmbiguousCreateError(ProviderError):
    """A create request may have reached the provider but its answer was lost.

    Re-sending could bill twice, so the caller must decide (for example, fail the job and refund).
    """
