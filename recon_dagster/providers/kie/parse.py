"""KIE's poll answers: the ``{code, msg, data}`` envelope and each family's state fields."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from recon_dagster.providers.kie.spec import KieFamily
from recon_dagster.providers.parse import (
    EXPIRED,
    FAILED,
    NOT_FOUND,
    RUNNING,
    SUCCEEDED,
    Body,
    is_int,
    one_of,
    progress_of,
    refs,
    show,
    status_of,
    task_id_of,
    text_of,
)
from recon_dagster.providers.status import MediaRef, ProviderProtocolError, UpstreamStatus

# Envelope codes KIE sends with HTTP 200 that mean "try again later", not "this task failed".
KIE_RETRYABLE_CODES = frozenset({429, 500, 501, 505})


class KieEnvelopeError(ProviderProtocolError):
    """A KIE envelope whose ``code`` is an error (not a task state): auth, credits, throttling...

    The HTTP layer turns it into a retry (``KIE_RETRYABLE_CODES``) or a ``ProviderHTTPError``.
    """

    def __init__(self, provider_kind: str, code: int, message: str | None) -> None:
        super().__init__(provider_kind, f"KIE envelope code {code}: {message or '(no message)'}")
        self.code = code
        self.message = message


def kie_envelope_message(body: Mapping[str, Any]) -> str | None:
    """KIE's message field (the docs spell it ``msg`` on some pages and ``message`` on others)."""
    for key in ("msg", "message"):
        text = text_of(body.get(key))
        if text:
            return text
    return None


# KIE's documented answer for a task it has no record of: ``{"code": 422, "msg": "recordInfo is
# null", "data": null}``. Other 422s (a malformed task id, a validation error) prove nothing about
# the task, so only this message is read as "no such task".
_KIE_NO_SUCH_RECORD = "recordinfo is null"


def is_kie_no_such_record(message: str | None) -> bool:
    """Whether a KIE envelope message is the documented "no such record" one."""
    return bool(message) and _KIE_NO_SUCH_RECORD in " ".join(str(message).lower().split())


def _kie_data(b: Body, body: dict[str, Any], task_id: str | None) -> dict[str, Any] | UpstreamStatus:
    """Open KIE's ``{code, msg, data}`` envelope: the data object, a not_found status, or an error."""
    code = body.get("code")
    if not is_int(code):
        raise b.fail(f"KIE envelope code must be an integer, got {show(code)}")
    message = kie_envelope_message(body)
    data = body.get("data")
    if code == 422 and data is None and is_kie_no_such_record(message):
        return status_of(b.kind, body, NOT_FOUND, task_id, error=message)
    if code != 200:
        raise KieEnvelopeError(b.kind, code, message)
    if not isinstance(data, dict):
        raise b.fail(f"data must be an object when code is 200, got {show(data)}")
    return data


def _kie_error(data: Mapping[str, Any], code_key: str, msg_key: str) -> str:
    code, msg = text_of(data.get(code_key)), text_of(data.get(msg_key))
    if code and msg:
        return f"{code}: {msg}"
    return msg or code or "failed without a message"


_MARKET_RUNNING = frozenset({"waiting", "queuing", "generating"})


def _kie_market(b: Body, body: dict[str, Any], data: dict[str, Any], tid: str | None) -> UpstreamStatus:
    state = data.get("state")
    progress = progress_of(data.get("progress"))
    if one_of(state, _MARKET_RUNNING):
        return status_of(b.kind, body, RUNNING, tid, progress=progress)
    if state == "fail":
        return status_of(b.kind, body, FAILED, tid, error=_kie_error(data, "failCode", "failMsg"))
    if state != "success":
        raise b.unknown_state("data.state", state)
    raw_result = data.get("resultJson")
    if isinstance(raw_result, str):
        try:
            result = json.loads(raw_result)
        except (ValueError, RecursionError) as exc:
            raise b.fail(f"data.resultJson is not valid JSON ({exc}): {show(raw_result)}") from None
    else:
        result = raw_result
    if not isinstance(result, dict):
        raise b.fail(f"data.resultJson must be a JSON object, got {show(raw_result)}")
    if "resultUrls" in result:
        media = refs(b.urls(result["resultUrls"], "data.resultJson.resultUrls"))
        return status_of(b.kind, body, SUCCEEDED, tid, media=media, progress=100)
    if "resultObject" in result:
        text_result = result["resultObject"]
        # A text result is the product; an empty one is a success with nothing to deliver.
        if not isinstance(text_result, dict) or not text_result:
            raise b.fail(f"data.resultJson.resultObject must be a non-empty object, got {show(text_result)}")
        return status_of(b.kind, body, SUCCEEDED, tid, result=text_result, progress=100)
    raise b.fail(f"data.resultJson has neither resultUrls nor resultObject: {show(raw_result)}")


def _success_flag(
    b: Body,
    body: dict[str, Any],
    data: dict[str, Any],
    tid: str | None,
    *,
    succeeded: frozenset[int],
    failed: frozenset[int],
    media: Callable[[dict[str, Any]], tuple[MediaRef, ...]],
) -> UpstreamStatus:
    flag = b.integer(data, "successFlag", "data.successFlag")
    if flag == 0:
        return status_of(b.kind, body, RUNNING, tid, progress=progress_of(data.get("progress")))
    if flag in succeeded:
        return status_of(b.kind, body, SUCCEEDED, tid, media=media(data), progress=100)
    if flag in failed:
        return status_of(b.kind, body, FAILED, tid, error=_kie_error(data, "errorCode", "errorMessage"))
    raise b.unknown_state("data.successFlag", flag)


def _response_urls(b: Body, kind: str) -> Callable[[dict[str, Any]], tuple[MediaRef, ...]]:
    def media(data: dict[str, Any]) -> tuple[MediaRef, ...]:
        response = b.obj(data, "response", "data.response")
        return refs(b.urls(response.get("resultUrls"), "data.response.resultUrls"), kind)

    return media


def _kontext_media(b: Body) -> Callable[[dict[str, Any]], tuple[MediaRef, ...]]:
    def media(data: dict[str, Any]) -> tuple[MediaRef, ...]:
        response = b.obj(data, "response", "data.response")
        url = b.url(response.get("resultImageUrl"), "data.response.resultImageUrl")
        return (MediaRef(url=url, kind="image"),)

    return media


_SUNO_RUNNING = frozenset({"PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"})
_SUNO_FAILED = frozenset({"CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED", "SENSITIVE_WORD_ERROR"})
# KIE's callback to the app failed. That says nothing against the music: with every track's audio
# present it is a success to recover (like Luma's successFlag 4); without, it proves nothing.
_SUNO_CALLBACK_FAILED = "CALLBACK_EXCEPTION"


def _kie_suno(b: Body, body: dict[str, Any], data: dict[str, Any], tid: str | None) -> UpstreamStatus:
    status = data.get("status")
    if one_of(status, _SUNO_RUNNING):
        return status_of(b.kind, body, RUNNING, tid)
    if one_of(status, _SUNO_FAILED):
        error = _kie_error(data, "errorCode", "errorMessage")
        return status_of(b.kind, body, FAILED, tid, error=f"{status}: {error}")
    if status == _SUNO_CALLBACK_FAILED:
        try:
            return _suno_tracks(b, body, data, tid)
        except ProviderProtocolError as exc:
            raise b.fail(f"{status} (the callback failed) without every track's audio: {exc}") from None
    if status != "SUCCESS":
        raise b.unknown_state("data.status", status)
    return _suno_tracks(b, body, data, tid)


def _suno_tracks(b: Body, body: dict[str, Any], data: dict[str, Any], tid: str | None) -> UpstreamStatus:
    response = b.obj(data, "response", "data.response")
    tracks = response.get("sunoData")
    if not isinstance(tracks, list) or not tracks:
        raise b.fail(f"data.response.sunoData must be a non-empty list, got {show(tracks)}")
    urls = []
    for i, track in enumerate(tracks):
        if not isinstance(track, dict):
            raise b.fail(f"data.response.sunoData[{i}] must be an object, got {show(track)}")
        urls.append(b.url(track.get("audioUrl"), f"data.response.sunoData[{i}].audioUrl"))
    return status_of(b.kind, body, SUCCEEDED, tid, media=refs(urls, "audio"), progress=100)


_RUNWAY_RUNNING = frozenset({"wait", "queueing", "generating"})


def _kie_runway(b: Body, body: dict[str, Any], data: dict[str, Any], tid: str | None) -> UpstreamStatus:
    state = data.get("state")
    if one_of(state, _RUNWAY_RUNNING):
        return status_of(b.kind, body, RUNNING, tid, progress=progress_of(data.get("progress")))
    if state == "fail":
        return status_of(b.kind, body, FAILED, tid, error=_kie_error(data, "failCode", "failMsg"))
    if state != "success":
        raise b.unknown_state("data.state", state)
    expire = data.get("expireFlag", 0)
    if expire is None:
        expire = 0
    if not is_int(expire) or expire not in (0, 1):
        raise b.fail(f"data.expireFlag must be 0 or 1, got {show(expire)}")
    if expire == 1:
        return status_of(b.kind, body, EXPIRED, tid, error="runway result expired (expireFlag=1)")
    video = b.obj(data, "videoInfo", "data.videoInfo")
    url = b.url(video.get("videoUrl"), "data.videoInfo.videoUrl")
    return status_of(b.kind, body, SUCCEEDED, tid, media=(MediaRef(url=url, kind="video"),), progress=100)


def parse_kie(b: Body, family: str, body: dict[str, Any], task_id: str | None) -> UpstreamStatus:
    opened = _kie_data(b, body, task_id)
    if isinstance(opened, UpstreamStatus):
        return opened
    data = opened
    tid = task_id_of(data.get("taskId"), task_id)
    if family == KieFamily.MARKET:
        return _kie_market(b, body, data, tid)
    if family == KieFamily.SUNO:
        return _kie_suno(b, body, data, tid)
    if family == KieFamily.RUNWAY:
        return _kie_runway(b, body, data, tid)
    if family == KieFamily.VEO:
        return _success_flag(
            b, body, data, tid, succeeded=frozenset({1}), failed=frozenset({2, 3}),
            media=_response_urls(b, "video"),
        )  # fmt: skip
    if family == KieFamily.KONTEXT:
        return _success_flag(
            b, body, data, tid, succeeded=frozenset({1}), failed=frozenset({2, 3}),
            media=_kontext_media(b),
        )  # fmt: skip
    if family == KieFamily.LUMA:
        # 4: the callback to us failed, but the generation itself succeeded.
        return _success_flag(
            b, body, data, tid, succeeded=frozenset({1, 4}), failed=frozenset({2, 3}),
            media=_response_urls(b, "video"),
        )  # fmt: skip
    raise AssertionError(f"not a KIE poll family: {family}")
