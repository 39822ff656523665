"""ElevenLabs' poll answers: a dubbing's ``status`` and, once dubbed, its audio endpoint."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from recon_dagster.providers.parse import (
    FAILED,
    RUNNING,
    SUCCEEDED,
    Body,
    one_of,
    show,
    status_of,
    task_id_of,
    text_of,
)
from recon_dagster.providers.status import MediaRef, UpstreamStatus

_DUBBING_RUNNING = frozenset({"preparing", "dubbing"})


def dubbing_audio_path(dubbing_id: str, language_code: str) -> str:
    """The byte endpoint of a finished dubbing, relative to the ElevenLabs base URL."""
    return f"/v1/dubbing/{quote(dubbing_id, safe='')}/audio/{quote(language_code, safe='')}"


def parse_elevenlabs(b: Body, family: str, body: dict[str, Any], task_id: str | None) -> UpstreamStatus:
    """A dubbing's answer (the one async family)."""
    return _parse_dubbing(b, body, task_id)


def _parse_dubbing(b: Body, body: dict[str, Any], task_id: str | None) -> UpstreamStatus:
    status = body.get("status")
    tid = task_id_of(body.get("dubbing_id"), task_id)
    if one_of(status, _DUBBING_RUNNING):
        return status_of(b.kind, body, RUNNING, tid)
    if status == "failed":
        return status_of(b.kind, body, FAILED, tid, error=text_of(body.get("error")) or "dubbing failed")
    if status != "dubbed":
        raise b.unknown_state("status", status)
    if tid is None:
        raise b.fail(f"dubbed without a dubbing_id, got {show(body.get('dubbing_id'))}")
    languages = body.get("target_languages")
    if languages is None:
        language = body.get("target_lang")
        path = "target_lang"
    elif isinstance(languages, list) and languages:
        language, path = languages[0], "target_languages[0]"
    else:
        raise b.fail(f"target_languages must be a non-empty list, got {show(languages)}")
    if not isinstance(language, str) or not language:
        raise b.fail(f"dubbed without a language code at {path}, got {show(language)}")
    ref = MediaRef(url=dubbing_audio_path(tid, language), kind="audio", needs_auth=True)
    return status_of(b.kind, body, SUCCEEDED, tid, media=(ref,), progress=100)
