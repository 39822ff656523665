"""Errors of the media layer, and the URL redaction every message goes through.

Provider media URLs are signed: the query string (and for some providers userinfo) carries
credentials, so no message, repr or log line of this package ever shows them.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(url: object) -> str:
    """Return ``url`` safe to log: userinfo dropped, query and fragment replaced by a marker."""
    text = str(url)
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    query = "<redacted>" if parts.query else ""
    fragment = "<redacted>" if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


class MediaError(Exception):
    """Base of every media error; ``url`` is already redacted."""

    def __init__(self, url: object, message: str) -> None:
        self.url = redact_url(url) if url is not None else None
        self.message = message
        super().__init__(f"{self.url}: {message}" if self.url else message)

    def reason(self) -> str:
        """What went wrong first, then where: the order a person reads a reason in."""
        return f"{self.message} (from {self.url})" if self.url else self.message


class MediaRefused(MediaError):
    """The URL breaks the fetch policy (scheme, userinfo, non-public address, redirect target)."""


class MediaExpired(MediaError):
    """The media URL answered 403, 404 or 410: a signed URL that aged out, or media deleted."""

    def __init__(self, url: object, status_code: int) -> None:
        super().__init__(url, f"HTTP {status_code}: media gone or signed URL expired")
        self.status_code = status_code


class MediaTooLarge(MediaError):
    """More than ``max_bytes`` arrived, or the declared Content-Length already exceeds it."""

    def __init__(self, url: object, max_bytes: int, seen: int, *, declared: bool = False) -> None:
        if declared:
            message = f"declared Content-Length {seen} exceeds the cap of {max_bytes} bytes"
        else:
            message = f"body exceeds the cap of {max_bytes} bytes (stopped after {seen} bytes)"
        super().__init__(url, message)
        self.max_bytes = max_bytes
        self.seen = seen


class MediaFetchError(MediaError):
    """Any other HTTP or network failure while fetching media (worth retrying later)."""

    def __init__(self, url: object, message: str, status_code: int | None = None) -> None:
        super().__init__(url, message)
        self.status_code = status_code


class MediaNotImage(MediaError):
    """Bytes handed to the watermarker are not an image Pillow can read."""


class MediaNotVideo(MediaError):
    """Bytes handed to the video watermarker are not a video FFmpeg can decode and re-encode."""


class MediaUnusable(MediaError):
    """The response is not the media promised: empty, an error page or other text, or encoded
    (``Content-Encoding``) although identity was asked for."""
