"""The pure poll parser: one provider poll body in, one ``UpstreamStatus`` out.

No network, no clock. Strict about what it acts on (the state field, the media of a success), tolerant
of everything else (unknown extra fields are ignored). Anything it cannot interpret raises
``ProviderProtocolError`` naming the kind and the offending value: it never guesses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard
from urllib.parse import quote, urlsplit

from recon_dagster.core.kinds import Family, get_kind
from recon_dagster.providers.status import (
    MediaRef,
    ProviderProtocolError,
    UpstreamState,
    UpstreamStatus,
)

RUNNING = UpstreamState.RUNNING
SUCCEEDED = UpstreamState.SUCCEEDED
FAILED = UpstreamState.FAILED
EXPIRED = UpstreamState.EXPIRED
NOT_FOUND = UpstreamState.NOT_FOUND

# Envelope codes KIE sends with HTTP 200 that mean "try again later", not "this task failed".
KIE_RETRYABLE_CODES = frozenset({429, 500, 501, 505})

_MAX_SHOWN = 160


class KieEnvelopeError(ProviderProtocolError):
    """A KIE envelope whose ``code`` is an error (not a task state): auth, credits, throttling...

    The HTTP layer turns it into a retry (``KIE_RETRYABLE_CODES``) or a ``ProviderHTTPError``.
    """

    def __init__(self, provider_kind: str, code: int, message: str | None) -> None:
        super().__init__(provider_kind, f"KIE envelope code {code}: {message or '(no message)'}")
        self.code = code
        self.message = message


def _show(value: object) -> str:
    """A bounded repr for error messages: provider bodies can be arbitrarily large."""
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "...'"


def _text(value: object) -> str | None:
    """A provider's free-form error field as one line of text (it is sometimes an object)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, default=str)[:1000]
    except (TypeError, ValueError):
        return _show(value)


def _one_of(value: object, states: frozenset[str]) -> bool:
    """Membership that does not trip over unhashable JSON values (a state given as an object)."""
    return isinstance(value, str) and value in states


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class _Body:
    """Typed access to one poll body, with errors that name the kind and the JSON path."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def fail(self, message: str) -> ProviderProtocolError:
        return ProviderProtocolError(self.kind, message)

    def obj(self, parent: Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
        value = parent.get(key)
        if not isinstance(value, dict):
            raise self.fail(f"{path} must be an object, got {_show(value)}")
        return value

    def string(self, parent: Mapping[str, Any], key: str, path: str) -> str:
        value = parent.get(key)
        if not isinstance(value, str) or not value:
            raise self.fail(f"{path} must be a non-empty string, got {_show(value)}")
        return value

    def integer(self, parent: Mapping[str, Any], key: str, path: str) -> int:
        value = parent.get(key)
        if not _is_int(value):
            raise self.fail(f"{path} must be an integer, got {_show(value)}")
        return value

    def urls(self, value: object, path: str) -> list[str]:
        """A non-empty list of http(s) URL strings."""
        if not isinstance(value, list) or not value:
            raise self.fail(f"{path} must be a non-empty list of URLs, got {_show(value)}")
        for item in value:
            if not _looks_like_url(item):
                raise self.fail(f"{path} must hold http(s) URLs, got {_show(item)}")
        return value

    def url(self, value: object, path: str) -> str:
        if not _looks_like_url(value):
            raise self.fail(f"{path} must be an http(s) URL, got {_show(value)}")
        assert isinstance(value, str)
        return value

    def unknown_state(self, path: str, value: object) -> ProviderProtocolError:
        return self.fail(f"unknown {path} {_show(value)}")


def _looks_like_url(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc)


_EXT_KIND = {
    **dict.fromkeys(("png", "jpg", "jpeg", "webp", "gif", "bmp", "avif", "heic"), "image"),
    **dict.fromkeys(("mp4", "mov", "webm", "mkv", "m4v", "avi"), "video"),
    **dict.fromkeys(("mp3", "wav", "m4a", "ogg", "flac", "aac", "opus"), "audio"),
    **dict.fromkeys(("safetensors", "tar", "zip", "bin", "ckpt", "pt"), "weights"),
}


def media_kind_of(url: str, default: str = "file") -> str:
    """A media kind hint from a URL's file extension (the downloader trusts Content-Type more)."""
    path = urlsplit(url).path
    ext = path.rsplit(".", 1)[-1].lower() if "." in path.rsplit("/", 1)[-1] else ""
    return _EXT_KIND.get(ext, default)


def _refs(urls: list[str], kind: str | None = None) -> tuple[MediaRef, ...]:
    return tuple(MediaRef(url=u, kind=kind or media_kind_of(u)) for u in urls)


def _progress(value: object) -> int | None:
    """Provider progress, when it is a plausible percentage; informational, so never an error."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value) if 0 <= value <= 100 else None


def _task_id(value: object, fallback: str | None) -> str | None:
    if isinstance(value, str) and value:
        return value
    return fallback


def _status(
    kind: str, body: dict[str, Any], state: UpstreamState, task_id: str | None, **fields: Any
) -> UpstreamStatus:
    return UpstreamStatus(provider_kind=kind, task_id=task_id, state=state, raw=body, **fields)


# --- KIE -------------------------------------------------------------------------------------


def kie_envelope_message(body: Mapping[str, Any]) -> str | None:
    """KIE's message field (the docs spell it ``msg`` on some pages and ``message`` on others)."""
    for key in ("msg", "message"):
        text = _text(body.get(key))
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


def _kie_data(b: _Body, body: dict[str, Any], task_id: str | None) -> dict[str, Any] | UpstreamStatus:
    """Open KIE's ``{code, msg, data}`` envelope: the data object, a not_found status, or an error."""
    code = body.get("code")
    if not _is_int(code):
        raise b.fail(f"KIE envelope code must be an integer, got {_show(code)}")
    message = kie_envelope_message(body)
    data = body.get("data")
    if code == 422 and data is None and is_kie_no_such_record(message):
        return _status(b.kind, body, NOT_FOUND, task_id, error=message)
    if code != 200:
        raise KieEnvelopeError(b.kind, code, message)
    if not isinstance(data, dict):
        raise b.fail(f"data must be an object when code is 200, got {_show(data)}")
    return data


def _kie_error(data: Mapping[str, Any], code_key: str, msg_key: str) -> str:
    code, msg = _text(data.get(code_key)), _text(data.get(msg_key))
    if code and msg:
        return f"{code}: {msg}"
    return msg or code or "failed without a message"


_MARKET_RUNNING = frozenset({"waiting", "queuing", "generating"})


def _kie_market(b: _Body, body: dict[str, Any], data: dict[str, Any], tid: str | None) -> UpstreamStatus:
    state = data.get("state")
    progress = _progress(data.get("progress"))
    if _one_of(state, _MARKET_RUNNING):
        return _status(b.kind, body, RUNNING, tid, progress=progress)
    if state == "fail":
        return _status(b.kind, body, FAILED, tid, error=_kie_error(data, "failCode", "failMsg"))
    if state != "success":
        raise b.unknown_state("data.state", state)
    raw_result = data.get("resultJson")
    if isinstance(raw_result, str):
        try:
            result = json.loads(raw_result)
        except (ValueError, RecursionError) as exc:
            raise b.fail(f"data.resultJson is not valid JSON ({exc}): {_show(raw_result)}") from None
    else:
        result = raw_result
    if not isinstance(result, dict):
        raise b.fail(f"data.resultJson must be a JSON object, got {_show(raw_result)}")
    if "resultUrls" in result:
        media = _refs(b.urls(result["resultUrls"], "data.resultJson.resultUrls"))
        return _status(b.kind, body, SUCCEEDED, tid, media=media, progress=100)
    if "resultObject" in result:
        text_result = result["resultObject"]
        # A text result is the product; an empty one is a success with nothing to deliver.
        if not isinstance(text_result, dict) or not text_result:
            raise b.fail(f"data.resultJson.resultObject must be a non-empty object, got {_show(text_result)}")
        return _status(b.kind, body, SUCCEEDED, tid, result=text_result, progress=100)
    raise b.fail(f"data.resultJson has neither resultUrls nor resultObject: {_show(raw_result)}")


def _success_flag(
    b: _Body,
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
        return _status(b.kind, body, RUNNING, tid, progress=_progress(data.get("progress")))
    if flag in succeeded:
        return _status(b.kind, body, SUCCEEDED, tid, media=media(data), progress=100)
    if flag in failed:
        return _status(b.kind, body, FAILED, tid, error=_kie_error(data, "errorCode", "errorMessage"))
    raise b.unknown_state("data.successFlag", flag)


def _response_urls(b: _Body, kind: str) -> Callable[[dict[str, Any]], tuple[MediaRef, ...]]:
    def media(data: dict[str, Any]) -> tuple[MediaRef, ...]:
        response = b.obj(data, "response", "data.response")
        return _refs(b.urls(response.get("resultUrls"), "data.response.resultUrls"), kind)

    return media


def _kontext_media(b: _Body) -> Callable[[dict[str, Any]], tuple[MediaRef, ...]]:
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


def _kie_suno(b: _Body, body: dict[str, Any], data: dict[str, Any], tid: str | None) -> UpstreamStatus:
    status = data.get("status")
    if _one_of(status, _SUNO_RUNNING):
        return _status(b.kind, body, RUNNING, tid)
    if _one_of(status, _SUNO_FAILED):
        error = _kie_error(data, "errorCode", "errorMessage")
        return _status(b.kind, body, FAILED, tid, error=f"{status}: {error}")
    if status == _SUNO_CALLBACK_FAILED:
        try:
            return _suno_tracks(b, body, data, tid)
        except ProviderProtocolError as exc:
            raise b.fail(f"{status} (the callback failed) without every track's audio: {exc}") from None
    if status != "SUCCESS":
        raise b.unknown_state("data.status", status)
    return _suno_tracks(b, body, data, tid)


def _suno_tracks(b: _Body, body: dict[str, Any], data: dict[str, Any], tid: str | None) -> UpstreamStatus:
    response = b.obj(data, "response", "data.response")
    tracks = response.get("sunoData")
    if not isinstance(tracks, list) or not tracks:
        raise b.fail(f"data.response.sunoData must be a non-empty list, got {_show(tracks)}")
    urls = []
    for i, track in enumerate(tracks):
        if not isinstance(track, dict):
            raise b.fail(f"data.response.sunoData[{i}] must be an object, got {_show(track)}")
        urls.append(b.url(track.get("audioUrl"), f"data.response.sunoData[{i}].audioUrl"))
    return _status(b.kind, body, SUCCEEDED, tid, media=_refs(urls, "audio"), progress=100)


_RUNWAY_RUNNING = frozenset({"wait", "queueing", "generating"})


def _kie_runway(b: _Body, body: dict[str, Any], data: dict[str, Any], tid: str | None) -> UpstreamStatus:
    state = data.get("state")
    if _one_of(state, _RUNWAY_RUNNING):
        return _status(b.kind, body, RUNNING, tid, progress=_progress(data.get("progress")))
    if state == "fail":
        return _status(b.kind, body, FAILED, tid, error=_kie_error(data, "failCode", "failMsg"))
    if state != "success":
        raise b.unknown_state("data.state", state)
    expire = data.get("expireFlag", 0)
    if expire is None:
        expire = 0
    if not _is_int(expire) or expire not in (0, 1):
        raise b.fail(f"data.expireFlag must be 0 or 1, got {_show(expire)}")
    if expire == 1:
        return _status(b.kind, body, EXPIRED, tid, error="runway result expired (expireFlag=1)")
    video = b.obj(data, "videoInfo", "data.videoInfo")
    url = b.url(video.get("videoUrl"), "data.videoInfo.videoUrl")
    return _status(b.kind, body, SUCCEEDED, tid, media=(MediaRef(url=url, kind="video"),), progress=100)


def _parse_kie(b: _Body, family: Family, body: dict[str, Any], task_id: str | None) -> UpstreamStatus:
    opened = _kie_data(b, body, task_id)
    if isinstance(opened, UpstreamStatus):
        return opened
    data = opened
    tid = _task_id(data.get("taskId"), task_id)
    if family is Family.KIE_MARKET:
        return _kie_market(b, body, data, tid)
    if family is Family.KIE_SUNO:
        return _kie_suno(b, body, data, tid)
    if family is Family.KIE_RUNWAY:
        return _kie_runway(b, body, data, tid)
    if family is Family.KIE_VEO:
        return _success_flag(
            b, body, data, tid, succeeded=frozenset({1}), failed=frozenset({2, 3}),
            media=_response_urls(b, "video"),
        )  # fmt: skip
    if family is Family.KIE_KONTEXT:
        return _success_flag(
            b, body, data, tid, succeeded=frozenset({1}), failed=frozenset({2, 3}),
            media=_kontext_media(b),
        )  # fmt: skip
    if family is Family.KIE_LUMA:
        # 4: the callback to us failed, but the generation itself succeeded.
        return _success_flag(
            b, body, data, tid, succeeded=frozenset({1, 4}), failed=frozenset({2, 3}),
            media=_response_urls(b, "video"),
        )  # fmt: skip
    raise AssertionError(f"not a KIE poll family: {family}")


# --- Replicate -------------------------------------------------------------------------------

_REPLICATE_RUNNING = frozenset({"starting", "processing"})
_REPLICATE_FAILED = frozenset({"failed", "canceled", "aborted"})


def _predict_time(body: Mapping[str, Any]) -> float | None:
    metrics = body.get("metrics")
    value = metrics.get("predict_time") if isinstance(metrics, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _parse_replicate(b: _Body, family: Family, body: dict[str, Any], task_id: str | None) -> UpstreamStatus:
    status = body.get("status")
    tid = _task_id(body.get("id"), task_id)
    metrics = {"predict_time_s": _predict_time(body)}
    if _one_of(status, _REPLICATE_RUNNING):
        return _status(b.kind, body, RUNNING, tid)
    if _one_of(status, _REPLICATE_FAILED):
        return _status(
            b.kind,
            body,
            FAILED,
            tid,
            error=f"{status}: {_text(body.get('error')) or 'no error message'}",
            **metrics,
        )
    if status != "succeeded":
        raise b.unknown_state("status", status)
    removed = body.get("data_removed", False)
    if not isinstance(removed, bool) and removed is not None:
        raise b.fail(f"data_removed must be a boolean, got {_show(removed)}")
    output = body.get("output")
    # Replicate deletes API outputs an hour after completion: output becomes null, data_removed true.
    # Only data_removed proves that; a null output without it proves nothing (count the attempt).
    if removed:
        return _status(b.kind, body, EXPIRED, tid, error="replicate output removed (data_removed)", **metrics)
    if output is None:
        raise b.fail("succeeded with output null but data_removed not true: neither a result nor expired")
    if family is Family.REPLICATE_TRAINING:
        if not isinstance(output, dict):
            raise b.fail(f"training output must be an object with weights, got {_show(output)}")
        weights = b.url(output.get("weights"), "output.weights")
        extra = {k: v for k, v in output.items() if k != "weights"}
        return _status(
            b.kind, body, SUCCEEDED, tid, media=(MediaRef(url=weights, kind="weights"),),
            result=extra or None, progress=100, **metrics,
        )  # fmt: skip
    if isinstance(output, str) and _looks_like_url(output):
        return _status(b.kind, body, SUCCEEDED, tid, media=_refs([output]), progress=100, **metrics)
    if isinstance(output, list) and output and all(_looks_like_url(u) for u in output):
        return _status(b.kind, body, SUCCEEDED, tid, media=_refs(output), progress=100, **metrics)
    _check_text_output(b, output)
    # Text and structured models (token lists, objects): the output itself is the result. Whether
    # the job wanted media instead is the finalizer's question (it knows the job).
    return _status(b.kind, body, SUCCEEDED, tid, result={"output": output}, progress=100, **metrics)


def _check_text_output(b: _Body, output: object) -> None:
    """A Replicate output that is not media must still be a result: not empty, not half media."""
    if output in ("", [], {}) or (isinstance(output, str) and not output.strip()):
        raise b.fail(f"succeeded with an empty output {_show(output)}: nothing to deliver")
    if isinstance(output, list):
        if any(_looks_like_url(u) for u in output):
            # Some media and something else: the media is promised but the answer is malformed.
            raise b.fail(f"output mixes URLs with other values: {_show(output)}")
        if not all(isinstance(u, str) for u in output) or not "".join(output).strip():
            raise b.fail(f"output list must hold text tokens or URLs, got {_show(output)}")


# --- ElevenLabs ------------------------------------------------------------------------------

_DUBBING_RUNNING = frozenset({"preparing", "dubbing"})


def dubbing_audio_path(dubbing_id: str, language_code: str) -> str:
    """The byte endpoint of a finished dubbing, relative to the ElevenLabs base URL."""
    return f"/v1/dubbing/{quote(dubbing_id, safe='')}/audio/{quote(language_code, safe='')}"


def _parse_dubbing(b: _Body, body: dict[str, Any], task_id: str | None) -> UpstreamStatus:
    status = body.get("status")
    tid = _task_id(body.get("dubbing_id"), task_id)
    if _one_of(status, _DUBBING_RUNNING):
        return _status(b.kind, body, RUNNING, tid)
    if status == "failed":
        return _status(b.kind, body, FAILED, tid, error=_text(body.get("error")) or "dubbing failed")
    if status != "dubbed":
        raise b.unknown_state("status", status)
    if tid is None:
        raise b.fail(f"dubbed without a dubbing_id, got {_show(body.get('dubbing_id'))}")
    languages = body.get("target_languages")
    if languages is None:
        language = body.get("target_lang")
        path = "target_lang"
    elif isinstance(languages, list) and languages:
        language, path = languages[0], "target_languages[0]"
    else:
        raise b.fail(f"target_languages must be a non-empty list, got {_show(languages)}")
    if not isinstance(language, str) or not language:
        raise b.fail(f"dubbed without a language code at {path}, got {_show(language)}")
    ref = MediaRef(url=dubbing_audio_path(tid, language), kind="audio", needs_auth=True)
    return _status(b.kind, body, SUCCEEDED, tid, media=(ref,), progress=100)


# --- Dispatch --------------------------------------------------------------------------------


def parse_poll_response(
    provider_kind: str, body: dict[str, Any], *, task_id: str | None = None
) -> UpstreamStatus:
    """Interpret one poll answer of ``provider_kind``; ``ProviderProtocolError`` if it cannot.

    ``task_id`` (optional) fills ``UpstreamStatus.task_id`` where the body does not carry it.
    ElevenLabs dubbing media comes back as a path relative to the ElevenLabs base URL; the
    resource makes it absolute. Raises ``UnknownProviderKind`` for a kind not in the registry.
    """
    kind = get_kind(provider_kind)
    b = _Body(kind.name)
    if not kind.is_async:
        raise b.fail("is a synchronous kind: there is no task to poll")
    if not isinstance(body, dict):
        raise b.fail(f"poll body must be a JSON object, got {_show(body)}")
    family = kind.family
    if family in (Family.REPLICATE_PREDICTION, Family.REPLICATE_TRAINING):
        return _parse_replicate(b, family, body, task_id)
    if family is Family.ELEVENLABS_DUBBING:
        return _parse_dubbing(b, body, task_id)
    return _parse_kie(b, family, body, task_id)
