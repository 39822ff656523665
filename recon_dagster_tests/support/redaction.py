"""Reading a text back through every decoding a key may have been echoed in, independently of
``recon_dagster.core.redaction``, to find what survives of a key."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Callable
from urllib.parse import unquote, unquote_plus

# A masked echo may keep a few characters at its edges (base64 bits shared with the bytes around
# the key, a cut shorter than CUT_PREFIX); never a run this long.
RUN = 8


def _json_unescape(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        body = m.group(1)
        if len(body) == 5:
            return chr(int(body[1:], 16))
        return {"n": "\n", "t": "\t"}.get(body, body)

    text = re.sub(r"\\(u[0-9a-fA-F]{4}|.)", one, text)
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _bytes_unescape(text: str) -> str:
    return re.sub(
        r"(?:\\x[0-9a-fA-F]{2})+",
        lambda m: bytes.fromhex(m.group().replace("\\x", "")).decode("utf-8", "replace"),
        text,
    )


def _base64_decoded(text: str) -> str:
    found = []
    for run in re.findall(r"[A-Za-z0-9+/_-]{4,}", text):
        run = run.translate(str.maketrans("-_", "+/"))
        for offset in range(4):
            part = run[offset:]
            part = part[: len(part) - len(part) % 4]
            found.append(base64.b64decode(part).decode("utf-8", "replace"))
    return "\n".join(found)


DECODERS: list[Callable[[str], str]] = [
    _json_unescape,
    _bytes_unescape,
    unquote,
    unquote_plus,
    html.unescape,
]


def views(text: str) -> set[str]:
    """The text read through up to two decodings, then base64 runs of each decoded."""
    out = {text}
    for _ in range(2):
        out |= {decode(view) for view in out for decode in DECODERS}
    return out | {_base64_decoded(view) for view in out}


def runs(key: str, text: str, n: int = RUN) -> set[str]:
    """Runs of ``n`` consecutive key characters (spaces as '+' too) found in any view of text."""
    found = set()
    for view in views(text):
        for variant in {key, key.replace(" ", "+")}:
            found |= {variant[i : i + n] for i in range(len(variant) - n + 1) if variant[i : i + n] in view}
    return found
