"""Is what arrived the media a job promised? (pure checks on headers and the first bytes)

A provider or its CDN can answer a media URL with 200 and no body, or with an error page (HTML,
XML, JSON, plain text), with or without a media Content-Type; completing a job with that charges
the user for nothing. And a media response with a ``Content-Encoding`` (we ask for ``identity``)
would be decoded by the HTTP client at any ratio: half a megabyte of gzip becomes half a gigabyte
on disk. Each of these is ``MediaUnusable``: nothing is stored, the caller counts an attempt.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from recon_dagster.media.errors import MediaUnusable

MEDIA_KINDS = frozenset({"image", "video", "audio"})
# Bytes judged before anything is passed on: every binary media format shows binary bytes here.
SNIFF_BYTES = 1024

_FOLDER_KIND = {"images": "image", "videos": "video", "audio": "audio"}
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/xhtml+xml",
        "application/javascript",
        "application/x-javascript",
        "application/ecmascript",
    }
)
# An SVG is an image made of XML text: kept when an image was promised.
_SVG = re.compile(
    rb"^(?:<\?xml[^>]*>|<!--.*?-->|<!doctype svg[^>]*>|\s)*<svg[\s>]", re.IGNORECASE | re.DOTALL
)
_TEXT_CONTROLS = frozenset(b"\t\n\r\f")
_PROMISED_PHRASE = {"image": "an image", "video": "a video", "audio": "audio"}


def promised_kind(ref_kind: str, folder: str) -> str | None:
    """The media kind an object must be: its reference's kind, else what the job type's folder
    names (``images``, ``videos``, ``audio``); None when neither promises media."""
    if ref_kind in MEDIA_KINDS:
        return ref_kind
    return _FOLDER_KIND.get(folder)


def declared_kind(content_type: str | None) -> str | None:
    """``image``, ``video`` or ``audio`` from a Content-Type, else None."""
    major = _media_type(content_type).split("/", 1)[0]
    return major if major in MEDIA_KINDS else None


def check_headers(
    content_type: str | None, content_encoding: str | None, content_length: int | None, promised: str | None
) -> str | None:
    """Why the response cannot be the promised media, judged on headers alone (None: read on).

    A text Content-Type where media was promised is judged once its first bytes are read
    (``checked_chunks``), so the reason can say what the body was."""
    encoding = (content_encoding or "").strip().lower()
    if encoding and encoding != "identity":
        return f"Content-Encoding {encoding!r} although identity was asked for"
    if content_length == 0:
        return f"{_media_type(content_type) or 'no Content-Type'}, 0 bytes (an empty object)" + _where(
            promised
        )
    return None


def sniff_problem(head: bytes, promised: str | None) -> str | None:
    """Why the first bytes of a body cannot be the promised media (None: they can)."""
    if promised is None or not _looks_like_text(head):
        return None
    if promised == "image" and _SVG.match(head.lstrip(b"\xef\xbb\xbf")):
        return None
    return f"{promised} promised, the body is {_text_shape(head)}"


def checked_chunks(
    chunks: Iterator[bytes],
    promised: str | None,
    url: object,
    content_type: str | None = None,
    content_length: int | None = None,
) -> Iterator[bytes]:
    """``chunks`` passed on unchanged once the first ``SNIFF_BYTES`` are judged to be media;
    ``MediaUnusable`` for an empty body, or a text body (or a text Content-Type) where media was
    promised, naming the type, the size and what the bytes look like."""
    head = b""
    held: list[bytes] = []
    judged = False
    for chunk in chunks:
        if judged:
            yield chunk
            continue
        held.append(chunk)
        head += chunk[: SNIFF_BYTES - len(head)]
        if len(head) >= SNIFF_BYTES:
            _judge(head, promised, url, content_type, content_length, complete=False)
            judged = True
            yield from held
            held = []
    if not judged:  # the whole body was shorter than the sniff window
        _judge(head, promised, url, content_type, content_length, complete=True)
        yield from held


def _judge(
    head: bytes,
    promised: str | None,
    url: object,
    content_type: str | None,
    content_length: int | None,
    *,
    complete: bool,
) -> None:
    media_type = _media_type(content_type)
    if not head:
        raise MediaUnusable(
            url, f"{media_type or 'no Content-Type'}, 0 bytes (an empty object)" + _where(promised)
        )
    declared_text = promised is not None and _is_text_type(media_type)
    if declared_text or sniff_problem(head, promised) is not None:
        raise MediaUnusable(url, describe_body(media_type, head, complete, content_length) + _where(promised))


def describe_body(media_type: str, head: bytes, complete: bool, content_length: int | None = None) -> str:
    """What a response body is, for a person: its declared type, its size and what its first
    bytes read as, e.g. 'text/plain, 52 bytes, reads as plain text: upstream error' (pure)."""
    if complete:
        size = f"{len(head)} bytes"
    elif content_length is not None:
        size = f"{content_length} bytes"
    else:
        size = f"over {len(head)} bytes"
    if not _looks_like_text(head):
        return f"{media_type or 'no Content-Type'}, {size}, binary"
    excerpt = " ".join(_as_text(head).split())
    excerpt = excerpt if len(excerpt) <= 60 else excerpt[:59] + "…"
    return f"{media_type or 'no Content-Type'}, {size}, reads as {_text_shape(head)}: {excerpt}"


def _where(promised: str | None) -> str:
    return f", where {_PROMISED_PHRASE.get(promised, promised)} was promised" if promised else ""


def _as_text(head: bytes) -> str:
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16-be" if head[0] == 0xFE else "utf-16-le"
        return head[2 : len(head) - len(head) % 2].decode(encoding, errors="replace")
    return head.decode("utf-8", errors="replace").lstrip("\ufeff")


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _is_text_type(media_type: str) -> bool:
    if media_type == "image/svg+xml":
        return False
    return (
        media_type.startswith("text/") or media_type in _TEXT_TYPES or media_type.endswith(("+json", "+xml"))
    )


def _looks_like_text(head: bytes) -> bool:
    """True when the bytes read as text in any charset: no control byte but tab, line breaks and
    form feed (UTF-16 text, which has a BOM, judged by its characters).

    Binary media formats (PNG, JPEG, GIF, WebP, MP4, WebM, MP3, WAV, OGG, FLAC...) carry control
    bytes (NUL above all) in their headers, and compressed data has them within any kilobyte;
    HTML, XML, JSON and plain-text error pages, in UTF-8, Latin-1 or another charset, do not.
    """
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16-be" if head[0] == 0xFE else "utf-16-le"
        text = head[2 : len(head) - len(head) % 2].decode(encoding, errors="replace")
        return not any(ord(c) < 32 and ord(c) not in _TEXT_CONTROLS for c in text)
    return not any(b < 32 and b not in _TEXT_CONTROLS for b in head) and 0x7F not in head


def _text_shape(head: bytes) -> str:
    start = head.lstrip(b"\xef\xbb\xbf\xff\xfe").replace(b"\x00", b"").lstrip().lower()
    if start.startswith((b"<!doctype html", b"<html")) or b"<body" in start or b"<head" in start:
        return "an HTML page"
    if start.startswith(b"<"):
        return "an XML document"
    if start.startswith((b"{", b"[")):
        return "a JSON document"
    return "plain text"
