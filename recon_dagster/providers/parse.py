"""The pure poll parser kit: one provider poll body in, one ``UpstreamStatus`` out.

Each provider's own answer parsing lives in its package (``providers/<name>/parse.py``) and is
named by its spec (``ProviderSpec.parser``); this module holds what they share (typed access to a
body with errors naming the JSON path, media refs, progress) and the dispatch by kind.

No network, no clock. Strict about what it acts on (the state field, the media of a success), tolerant
of everything else (unknown extra fields are ignored). Anything it cannot interpret raises
``ProviderProtocolError`` naming the kind and the offending value: it never guesses.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, TypeGuard
from urllib.parse import urlsplit

from recon_dagster.core.kinds import get_kind, provider_spec
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

_MAX_SHOWN = 160


def show(value: object) -> str:
    """A bounded repr for error messages: provider bodies can be arbitrarily large."""
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "...'"


def text_of(value: object) -> str | None:
    """A provider's free-form error field as one line of text (it is sometimes an object)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, default=str)[:1000]
    except (TypeError, ValueError):
        return show(value)


def one_of(value: object, states: frozenset[str]) -> bool:
    """Membership that does not trip over unhashable JSON values (a state given as an object)."""
    return isinstance(value, str) and value in states


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class Body:
    """Typed access to one poll body, with errors that name the kind and the JSON path."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def fail(self, message: str) -> ProviderProtocolError:
        return ProviderProtocolError(self.kind, message)

    def obj(self, parent: Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
        value = parent.get(key)
        if not isinstance(value, dict):
            raise self.fail(f"{path} must be an object, got {show(value)}")
        return value

    def string(self, parent: Mapping[str, Any], key: str, path: str) -> str:
        value = parent.get(key)
        if not isinstance(value, str) or not value:
            raise self.fail(f"{path} must be a non-empty string, got {show(value)}")
        return value

    def integer(self, parent: Mapping[str, Any], key: str, path: str) -> int:
        value = parent.get(key)
        if not is_int(value):
            raise self.fail(f"{path} must be an integer, got {show(value)}")
        return value

    def urls(self, value: object, path: str) -> list[str]:
        """A non-empty list of http(s) URL strings."""
        if not isinstance(value, list) or not value:
            raise self.fail(f"{path} must be a non-empty list of URLs, got {show(value)}")
        for item in value:
            if not looks_like_url(item):
                raise self.fail(f"{path} must hold http(s) URLs, got {show(item)}")
        return value

    def url(self, value: object, path: str) -> str:
        if not looks_like_url(value):
            raise self.fail(f"{path} must be an http(s) URL, got {show(value)}")
        assert isinstance(value, str)
        return value

    def unknown_state(self, path: str, value: object) -> ProviderProtocolError:
        return self.fail(f"unknown {path} {show(value)}")


def looks_like_url(value: object) -> bool:
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


def refs(urls: list[str], kind: str | None = None) -> tuple[MediaRef, ...]:
    return tuple(MediaRef(url=u, kind=kind or media_kind_of(u)) for u in urls)


def progress_of(value: object) -> int | None:
    """Provider progress, when it is a plausible percentage; informational, so never an error."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value) if 0 <= value <= 100 else None


def task_id_of(value: object, fallback: str | None) -> str | None:
    if isinstance(value, str) and value:
        return value
    return fallback


def status_of(
    kind: str, body: dict[str, Any], state: UpstreamState, task_id: str | None, **fields: Any
) -> UpstreamStatus:
    return UpstreamStatus(provider_kind=kind, task_id=task_id, state=state, raw=body, **fields)


# --- Dispatch --------------------------------------------------------------------------------

# A provider's parser: (typed body, the kind's family, the body, the task id) -> status.
Parser = Callable[[Body, str, dict[str, Any], "str | None"], UpstreamStatus]


@cache
def provider_parser(provider: str) -> Parser:
    """The poll parser a provider's spec names (``"module:function"``)."""
    name = provider_spec(provider).parser
    if name is None:
        raise LookupError(f"provider {provider!r} declares no poll parser")
    module, _, attribute = name.partition(":")
    parser: Parser = getattr(importlib.import_module(module), attribute)
    return parser


def parse_poll_response(
    provider_kind: str, body: dict[str, Any], *, task_id: str | None = None
) -> UpstreamStatus:
    """Interpret one poll answer of ``provider_kind``; ``ProviderProtocolError`` if it cannot.

    ``task_id`` (optional) fills ``UpstreamStatus.task_id`` where the body does not carry it.
    Media a provider serves from its own API may come back as a path relative to its base URL;
    its resource makes it absolute. Raises ``UnknownProviderKind`` for a kind not in the registry.
    """
    kind = get_kind(provider_kind)
    b = Body(kind.name)
    if not kind.is_async:
        raise b.fail("is a synchronous kind: there is no task to poll")
    if not isinstance(body, dict):
        raise b.fail(f"poll body must be a JSON object, got {show(body)}")
    return provider_parser(kind.provider)(b, kind.family, body, task_id)
