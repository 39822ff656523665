"""Pure reconcile decisions: (job row, what upstream said) -> what to do. No I/O here.

Kept apart from the effects so every branch of spec 5.5/5.6 is a plain function call in tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

from recon_dagster.core.kinds import KINDS, MAX_ATTEMPTS
from recon_dagster.core.types import JobRow
from recon_dagster.media.base import media_folder
from recon_dagster.providers.status import UpstreamState, UpstreamStatus


class Route(StrEnum):
    """How a stale row can be reconciled at all."""

    POLL = "poll"  # async kind with a persisted task id: ask upstream
    SWEEP = "sweep"  # sync kind, no task id, unknown or missing kind: fail + refund (5.6)


class Action(StrEnum):
    FINALIZE = "finalize"  # upstream succeeded: finalize_job_with_media
    FAIL = "fail"  # upstream failed / lost the task / media gone: fail + refund
    RETRY_LATER = "retry_later"  # still running, or this attempt errored: count the attempt
    FORCE_FAIL = "force_fail"  # attempts exhausted: force-fail + refund + anomaly


class Outcome(StrEnum):
    """What one reconcile attempt did to one job (the tick summary counts these)."""

    RECOVERED = "recovered"
    FAILED = "failed"
    SWEPT = "swept"
    STILL_RUNNING = "still_running"
    ERROR = "error"
    EXHAUSTED = "exhausted"
    LOST_RACE = "lost_race"  # another writer (worker, webhook, cancel) got there first
    SKIPPED = "skipped"  # not ours any more (lease lost, row no longer in flight)
    # The poll never left this process (its own limiter refused it, or its deadline ran
    # out waiting for a token or a slot): no attempt counted, the job rescheduled. The reason is
    # the first word of the outcome's detail (``not_sent_reason``).
    NOT_SENT = "not_sent"
    # A fault of ours, not the job's (our configuration: a provider key missing or refused; our
    # storage: the media store refused the write; our database: a blip mid-attempt): no attempt
    # counted, nothing refunded, the job due again after a cadence. The fault is the first word of
    # the detail (``reconcile.cause.OurFault``).
    OUR_FAULT = "our_fault"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def route(row: JobRow) -> Route:
    kind = KINDS.get(row.provider_kind or "")
    if kind is None or not kind.is_async or not row.provider_task_id:
        return Route.SWEEP
    return Route.POLL


def decide_on_status(status: UpstreamStatus, *, breaker_open: bool = False) -> Decision:
    """Map a successful poll to an action (attempt accounting is decide_after_attempt's job).

    ``breaker_open``: the provider's recent answers are a burst of not-found (a wrong token,
    account or base path, not lost tasks), so a not-found proves nothing and only counts an attempt.
    """
    match status.state:
        case UpstreamState.SUCCEEDED:
            return Decision(Action.FINALIZE, "upstream succeeded")
        case UpstreamState.FAILED:
            return Decision(Action.FAIL, f"upstream failed: {status.error or 'no message'}")
        case UpstreamState.NOT_FOUND if breaker_open:
            return Decision(
                Action.RETRY_LATER,
                "upstream task not found, but the provider's not-found breaker is open "
                "(a burst of not-found answers: likely a misconfiguration); not failing",
            )
        case UpstreamState.NOT_FOUND:
            return Decision(Action.FAIL, "upstream task not found")
        case UpstreamState.EXPIRED:
            return Decision(Action.FAIL, "upstream result expired before it was collected")
        case UpstreamState.RUNNING:
            said = f": {status.stage}" if status.stage else ""
            return Decision(Action.RETRY_LATER, f"upstream still running{said}")
    raise AssertionError(f"unhandled state {status.state!r}")  # pragma: no cover


def decide_after_attempt(attempts_after_bump: int, max_attempts: int = MAX_ATTEMPTS) -> Action:
    """An attempt that ended without a terminal state was counted; is that the last one allowed?

    A negative count was never written by reconciliation (a hand edit, a bad migration): it is
    treated as exhausted, not as a budget larger than the cap."""
    if attempts_after_bump >= max_attempts or attempts_after_bump < 0:
        return Action.FORCE_FAIL
    return Action.RETRY_LATER


def not_sent_detail(reason: str, message: str, due_in_s: float) -> str:
    """The detail of a ``not_sent`` outcome: the reason first, as ``not_sent_reason`` reads it."""
    return f"{reason}: {message}; no attempt counted, due again in {due_in_s:.0f} s"


def not_sent_reason(detail: str | None) -> str | None:
    """The reason a ``not_sent`` outcome recorded (``limiter_refused``,
    ``token_wait_past_deadline``, ``slot_wait_past_deadline``, ``limiter_database_unreachable``)."""
    if not detail:
        return None
    head = detail.split(":", 1)[0].strip()
    return head if head and " " not in head else None


def failure_message(reason: str) -> str:
    """The error_message a reconcile failure leaves on the job row."""
    return f"reconcile: {reason}"


# --- what a success must carry -------------------------------------------------------------------


_PROMISED_BY_FOLDER = {"images": "image", "videos": "video", "audio": "audio", "loras": "weights"}
# How a reason names what was promised: "where an image was promised".
_PROMISED_PHRASE = {"image": "an image", "video": "a video", "audio": "audio", "weights": "model weights"}


def promised_kind(provider_kind: str | None, job_type: str) -> str | None:
    """What a job of this kind and type can only be completed with: ``image``, ``video``,
    ``audio``, ``weights`` or ``media`` (a type naming none of them); None when it promises no media.

    Every async kind promises media, except the text-capable ones (``ProviderKind.text_result``), where the
    job type decides: a type naming images, video, audio or weights promises media. Sync and unknown
    kinds promise nothing here: their results never pass through a media URL this library fetches.
    """
    kind = KINDS.get(provider_kind or "")
    if kind is None or not kind.is_async:
        return None
    folder = media_folder(job_type)
    if kind.text_result and folder == "files":
        return None
    return _PROMISED_BY_FOLDER.get(folder, "media")


def promised_media(provider_kind: str | None, job_type: str) -> bool:
    """Whether a job of this kind and type can only be completed with stored media."""
    return promised_kind(provider_kind, job_type) is not None


def promised_phrase(promised: str) -> str:
    """``image`` -> "an image", as in "where an image was promised"."""
    return _PROMISED_PHRASE.get(promised, promised)


def describe_result(result: object, limit: int = 80) -> str:
    """What a success carried instead of media, for a person: its shape, size and a short start,
    e.g. 'a JSON object of 31 bytes: {"text": "sandbox text result"}' (pure)."""
    if result is None or result == {} or result == [] or result == "":
        return "nothing"
    if isinstance(result, str):
        text, shape = result, f"a text of {len(result)} characters"
    else:
        try:
            text = json.dumps(result, ensure_ascii=False, sort_keys=True, default=str)
        except (TypeError, ValueError):
            text = repr(result)
        name = (
            "object"
            if isinstance(result, dict)
            else "array"
            if isinstance(result, list)
            else type(result).__name__
        )
        shape = f"a JSON {name} of {len(text.encode())} bytes"
    flat = " ".join(text.split())
    return f"{shape}: {flat if len(flat) <= limit else flat[: limit - 1] + '…'}"


def unusable_result(*, media: int, result: object, promised: str | bool | None) -> str | None:
    """Why a success cannot be completed and charged (None: it can), saying what came back.

    ``media`` is the number of objects stored (or about to be); ``result`` the text result;
    ``promised`` what the job promised (``promised_kind``; True: media of any kind).
    """
    if promised and media == 0:
        what = promised_phrase(promised) if isinstance(promised, str) else "media"
        return f"upstream succeeded with no media, only {describe_result(result)}, where {what} was promised"
    if media == 0 and not result:
        return "upstream succeeded with no media and no result"
    return None


def foreign_task(row_task: str | None, result_task: str | None) -> bool:
    """Whether a result names another upstream task than the one the row persisted. A result
    without a task id, or a row without one yet, names no conflict."""
    return row_task is not None and result_task is not None and result_task != row_task


def refused_before_download(row: JobRow, status: UpstreamStatus) -> str | None:
    """Why ``finalize_job_with_media`` refuses this success before any download (None: it goes
    on to the media): another task's result, or a success that cannot carry what the job promised.
    The first phase of finalize and the plan (and shadow) apply these same checks, so what they
    predict for a success is what enforce does: count the attempt, never complete it."""
    if foreign_task(row.provider_task_id, status.task_id):
        return f"result of task {status.task_id}, but the row's task is {row.provider_task_id}"
    return unusable_result(
        media=len(status.media),
        result=status.result,
        promised=promised_kind(status.provider_kind, row.job_type),
    )


# --- the per-provider not-found breaker -------------------------------------------------------


@dataclass(frozen=True)
class BreakerPolicy:
    """When a burst of not-found answers of one kind (or provider) stops counting as lost tasks."""

    # Open once MORE than this many not-found answers arrived within the window...
    burst: int = 5
    # ...and they are more than this share of the kind's (or provider's) answers in the window.
    share: float = 0.5
    window_s: float = 600.0


def not_found_breaker_open(not_found: int, answers: int, policy: BreakerPolicy) -> bool:
    """The breaker's rule over one kind's (or one provider's) answers within the window (both
    counts include the answer being judged)."""
    return not_found > policy.burst and not_found > policy.share * answers
