"""Secrets never leave the process: one registry of the keys in use, one ``redact_secrets(text)``.

Provider resources register every key when they read it (``register_secret``); text that leaves
the process passes ``redact_secrets``: provider exception messages (``ProviderError``), the
reconciler's ``reconcile_last_error`` / ``error_message`` / ``reconcile_events.detail``, and every
log record of the process (a log-record factory installed with the first secret, so Dagster's
event log and compute logs see only masked text).

A secret is masked in every spelling a message can carry it. The text is searched as it is and
read back through each escaping a transport or a serializer applies: JSON / JavaScript / Python
escapes (``\\uXXXX`` in either hex case and surrogate pairs, ``\\xHH`` UTF-8 bytes, ``\\/`` and any
escaped punctuation; and with any run of backslashes before an escape taken as one, for JSON
nested deeper), URL-encoding and HTML character references, each for any subset of the
characters, each read once and twice (JSON inside JSON, ``%252F``, ``&amp;#47;``). In each of
those readings we look for the key (configured and stripped alike; ``+`` for its spaces) and for
its base64 / base64url encodings: the characters that depend on the key's bytes only, at each of
the three offsets the key can have inside a larger base64'd string (``Basic base64(user:key)``),
so padding and the surrounding bytes do not matter. A run of ``CUT_PREFIX`` characters that starts
one of those is masked too (a message cut to a length limit inside a key), as far as it goes on.
What is found is masked in the original text, whole escape sequences included.

Cost (it runs on every log record): a text without ``\\``, ``%`` or ``&`` is one substring
search per spelling; otherwise one decoding pass (two for nested escapes) per escaping present,
and the searches again in each reading whose escapes stand for a character some key is spelled
with. The spellings are computed once per registered set of keys.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.entities import html5

MASK = "[redacted]"
# Shorter values are not treated as secrets: masking every "ab" in every message helps nobody.
MIN_SECRET_LENGTH = 8
# A message cut to a length limit may end inside a key: a run of at least this many characters
# that starts a registered spelling is masked too (shorter runs are public prefixes like "sk-proj-").
CUT_PREFIX = 10

_HEX = "[0-9a-fA-F]"
# Named references that stand for one ASCII character (``&sol;``, ``&amp;``, ``&lowbar;`` ...).
_ENTITIES = {
    name[:-1]: ch for name, ch in html5.items() if name.endswith(";") and len(ch) == 1 and " " < ch < "\x7f"
}


def _utf8(lead: str, cont: str) -> str:
    """One character as its UTF-8 bytes, each written as a marker and two hex digits
    (``\\xc3\\xa9``, ``%C3%A9``)."""
    return rf"{lead}[0-7]{_HEX}|{lead}[c-fC-F]{_HEX}(?:{cont}[89abAB]{_HEX}){{1,3}}"


@dataclass(frozen=True)
class _Escaping:
    """One way of escaping characters: its marker, a token per escaped character, its decoding."""

    marker: str
    token: re.Pattern[str]
    decode: Callable[[re.Match[str]], str]
    # Read a second time (``%2541``, ``&amp;#65;``, ``\\\\/``); a run read as one needs no second.
    twice: bool = True


def _code_point(text: str, base: int) -> str | None:
    value = int(text, base)
    return chr(value) if value <= 0x10FFFF else None


def _utf8_bytes(text: str) -> str | None:
    try:
        return bytes.fromhex(re.sub(r"[^0-9a-fA-F]", "", text)).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


def _decode_backslash(m: re.Match[str]) -> str:
    kind, body = m.lastgroup, m.group(m.lastgroup or 0)
    if kind == "pair":
        high, low = int(body[1:5], 16), int(body[-4:], 16)
        return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
    decoded = _utf8_bytes(body) if kind == "bytes" else body if kind == "char" else _code_point(body, 16)
    return m.group() if decoded is None else decoded


def _decode_percent(m: re.Match[str]) -> str:
    decoded = _utf8_bytes(m.group())
    return m.group() if decoded is None else decoded


def _decode_entity(m: re.Match[str]) -> str:
    kind, body = m.lastgroup, m.group(m.lastgroup or 0)
    decoded = _ENTITIES.get(body) if kind == "name" else _code_point(body, 10 if kind == "dec" else 16)
    return m.group() if decoded is None else decoded


def _backslash_escapes(run: str) -> re.Pattern[str]:
    """JSON / JavaScript / Python escapes of one character, each behind ``run`` (a backslash)."""
    return re.compile(
        rf"{run}(?:(?P<pair>u[dD][89abAB]{_HEX}{{2}}{run}u[dD][c-fC-F]{_HEX}{{2}})"
        rf"|u(?P<u4>{_HEX}{{4}})|u\{{(?P<ub>{_HEX}{{1,6}})\}}|U(?P<u8>{_HEX}{{8}})"
        rf"|(?P<bytes>{_utf8('x', run + 'x')})"
        r"|(?P<char>[^\w\s]))"
    )


# Every pattern starts with its marker as a literal, so ``re`` skips to markers at C speed.
_ESCAPINGS = (
    _Escaping("\\", _backslash_escapes(r"\\"), _decode_backslash),
    # A run of backslashes before an escape read as one: JSON inside JSON doubles them at each
    # level (``\\\\u0073``), and a stray backslash before an escape shifts the exact pairing.
    _Escaping("\\\\", _backslash_escapes(r"\\\\*"), _decode_backslash, twice=False),
    _Escaping("%", re.compile(_utf8("%", "%")), _decode_percent),
    _Escaping(
        "&",
        re.compile(
            rf"&(?:#(?P<dec>[0-9]{{1,7}});?|#[xX](?P<hex>{_HEX}{{1,6}});?"
            rf"|(?P<name>{'|'.join(sorted(_ENTITIES, key=len, reverse=True))});)"
        ),
        _decode_entity,
    ),
)
_URLSAFE = str.maketrans("+/", "-_")


@dataclass(frozen=True)
class _Registry:
    """The registered keys and what finds them; replaced whole, so readers need no lock."""

    secrets: frozenset[str]
    spellings: tuple[str, ...]
    # The first CUT_PREFIX characters of each spelling: what is searched for (a cut key included).
    # Plain substring searches: ``str.find`` is several times faster than one regex alternation.
    starts: tuple[str, ...]
    alphabet: frozenset[str]


_lock = threading.Lock()
_registry: _Registry | None = None
_factory_installed = False


def spellings(secret: str) -> set[str]:
    """What is looked for, in every reading of a text, to find ``secret`` (pure)."""
    key = secret.strip()
    if len(key) < MIN_SECRET_LENGTH:
        return set()
    found = {key, key.replace(" ", "+")}
    raw = key.encode("utf-8", "surrogatepass")
    for offset in range(3):
        # Characters [first, last) of base64(<offset bytes> + key + ...) depend on the key alone.
        first, last = (8 * offset + 5) // 6, 8 * (offset + len(raw)) // 6
        inner = base64.b64encode(bytes(offset) + raw + bytes(2)).decode("ascii")[first:last]
        found |= {inner, inner.translate(_URLSAFE)}
    return {s for s in found if len(s) >= MIN_SECRET_LENGTH}


def register_secret(secret: str | None) -> None:
    """Mask ``secret`` (in all its spellings) in everything that leaves the process from now on."""
    global _registry
    if not secret or not isinstance(secret, str) or len(secret.strip()) < MIN_SECRET_LENGTH:
        return
    key = secret.strip()
    with _lock:
        known = _registry.secrets if _registry is not None else frozenset()
        if key in known:
            return
        keys = known | {key}
        found: set[str] = set().union(*(spellings(k) for k in keys))
        _registry = _Registry(
            secrets=keys,
            spellings=tuple(sorted(found, key=len, reverse=True)),
            alphabet=frozenset("".join(found)),
            starts=tuple(sorted({s[:CUT_PREFIX] for s in found})),
        )
    _install_log_factory()


def register_url_secret(url: str | None) -> None:
    """Mask what is secret in a URL that carries a credential (a webhook URL): its password and
    each token-like path segment or query value, never the URL as a whole.

    A whole URL registered as one secret would mask every text starting with its first
    ``CUT_PREFIX`` characters (``https://ho``, ``http://127``): every other URL of that scheme and
    host. The host, the port and words such as ``services`` or ``triggers`` are not secret; the
    token is."""
    if not url or not isinstance(url, str):
        return
    parts = urllib.parse.urlsplit(url.strip())
    register_secret(parts.password)
    for segment in parts.path.split("/"):
        if _token_like(urllib.parse.unquote(segment)):
            register_secret(urllib.parse.unquote(segment))
    for _key, value in urllib.parse.parse_qsl(parts.query):
        if _token_like(value):
            register_secret(value)


def _token_like(text: str) -> bool:
    """A value long enough to be a credential, with a digit in it or long enough to be random,
    and not a date, a version or a number (``2016-06-01``, ``1.0``)."""
    if len(text) < MIN_SECRET_LENGTH or re.fullmatch(r"[0-9.:-]+", text):
        return False
    return any(c.isdigit() for c in text) or len(text) >= 20


def redact_secrets(text: str) -> str:
    """``text`` with every registered secret masked."""
    registry = _registry
    if registry is None or not text:
        return text
    spans = [
        _source_span(text, path, a, b)
        for reading, path in _readings(text, registry.alphabet)
        for a, b in _found(reading, registry)
    ]
    if not spans:
        return text
    out: list[str] = []
    pos = 0
    for a, b in sorted(spans):
        if b <= pos:
            continue
        if a > pos or not out:
            out += [text[pos:a], MASK]
        pos = b
    out.append(text[pos:])
    return "".join(out)


def _readings(text: str, alphabet: frozenset[str]) -> Iterator[tuple[str, tuple[_Escaping, ...]]]:
    """``text``, then ``text`` read back through each escaping it contains, once and twice, each
    with the escapings that lead to it. A reading whose escapes stand for no character any key is
    spelled with is not given: it finds nothing the text it was read from does not."""
    yield text, ()
    for escaping in _ESCAPINGS:
        if escaping.marker in text:
            once, relevant, remarked = _read(text, escaping, alphabet)
            if relevant:
                yield once, (escaping,)
            if escaping.twice and remarked:
                twice, relevant, _ = _read(once, escaping, alphabet)
                if relevant:
                    yield twice, (escaping, escaping)


def _read(text: str, escaping: _Escaping, alphabet: frozenset[str]) -> tuple[str, bool, bool]:
    """``text`` read back through ``escaping``; whether an escape stood for a key character; and
    whether one stood for the marker (only then can a second reading find new escapes)."""
    relevant = remarked = False

    def decode(m: re.Match[str]) -> str:
        nonlocal relevant, remarked
        piece = escaping.decode(m)
        relevant = relevant or not alphabet.isdisjoint(piece)
        remarked = remarked or escaping.marker[0] in piece
        return piece

    return escaping.token.sub(decode, text), relevant, remarked


def _source_span(text: str, path: tuple[_Escaping, ...], a: int, b: int) -> tuple[int, int]:
    """The span of ``text`` that characters [a, b) of its reading through ``path`` come from."""
    maps = []
    for escaping in path:
        text, starts, ends = _decode_mapped(text, escaping)
        maps.append((starts, ends))
    for starts, ends in reversed(maps):
        a, b = starts[a], ends[b - 1]
    return a, b


def _decode_mapped(text: str, escaping: _Escaping) -> tuple[str, list[int], list[int]]:
    """``text`` read through ``escaping`` and, per character read, where it starts and ends."""
    pieces: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    pos = 0
    for m in escaping.token.finditer(text):
        a, b = m.span()
        piece = escaping.decode(m)
        pieces += [text[pos:a], piece]
        starts += [*range(pos, a), *[a] * len(piece)]
        ends += [*range(pos + 1, a + 1), *[b] * len(piece)]
        pos = b
    pieces.append(text[pos:])
    starts += range(pos, len(text))
    ends += range(pos + 1, len(text) + 1)
    return "".join(pieces), starts, ends


def _found(reading: str, registry: _Registry) -> list[tuple[int, int]]:
    """Spans of ``reading`` holding a spelling, or at least its first CUT_PREFIX characters (as
    far as it goes on: a cut key, or a near-copy of one)."""
    spans = []
    at = 0
    while hits := [i for start in registry.starts if (i := reading.find(start, at)) >= 0]:
        a = min(hits)
        length = max(
            _common_length(reading, a, s) for s in registry.spellings if reading.startswith(s[:CUT_PREFIX], a)
        )
        spans.append((a, a + length))
        at = a + length
    return spans


def _common_length(text: str, start: int, spelling: str) -> int:
    n = 0
    for x, y in zip(text[start : start + len(spelling)], spelling, strict=False):
        if x != y:
            break
        n += 1
    return n


def _redact_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a malformed format: the logging module reports it, we leave it be
        return
    masked = redact_secrets(message)
    if masked != message:
        record.msg, record.args = masked, None
    if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        masked = redact_secrets(text)
        if masked != text:
            record.exc_text = masked


def _install_log_factory() -> None:
    """Mask secrets in every log record created in this process (once)."""
    global _factory_installed
    with _lock:
        if _factory_installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: object, **kwargs: object) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            _redact_record(record)
            return record

        logging.setLogRecordFactory(factory)
        _factory_installed = True


def forget_secrets() -> None:
    """Empty the registry (tests only)."""
    global _registry
    with _lock:
        _registry = None


@contextmanager
def isolated_secrets() -> Iterator[None]:
    """An empty registry for the block, the previous one back after it (tests only)."""
    global _registry
    with _lock:
        saved, _registry = _registry, None
    try:
        yield
    finally:
        with _lock:
            _registry = saved
