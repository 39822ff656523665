"""Secrets never leave the process: one registry of the keys in use, one ``redact_secrets(text)``.

Provider resources register every key when they read it (``register_secret``); text that leaves
the process passes ``redact_secrets``: provider exception messages (``ProviderError``), the
reconciler's ``reconcile_last_error`` / ``error_message`` / ``reconcile_events.detail``, and every
log record of the process (a log-record factory installed with the first secret, so Dagster's
event log and compute logs see only masked text).

A secret is masked in every form a message can carry it: as configured (a trailing newline from a
file or a secret store included), stripped, URL-encoded (``quote``, ``quote_plus``) and
repr-escaped (``\\n`` as two characters, as in httpx's "Illegal header value b'...\\n'").
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from urllib.parse import quote, quote_plus

MASK = "[redacted]"
# Shorter values are not treated as secrets: masking every "ab" in every message helps nobody.
MIN_SECRET_LENGTH = 8
# A message cut to a length limit may end inside a key: a run of at least this many characters
# that starts a registered form is masked too (shorter runs are public prefixes like "sk-proj-").
CUT_PREFIX = 10

_lock = threading.Lock()
_forms: set[str] = set()
_pattern: re.Pattern[str] | None = None
_prefixes: re.Pattern[str] | None = None
_factory_installed = False


def secret_forms(secret: str) -> set[str]:
    """Every spelling of ``secret`` a message may carry (pure)."""
    forms: set[str] = set()
    for value in {secret, secret.strip()}:
        if len(value) < MIN_SECRET_LENGTH:
            continue
        escaped = repr(value)[1:-1]
        forms.update(
            {
                value,
                escaped,
                quote(value, safe=""),
                quote(value),
                quote_plus(value),
                escaped.replace("\\\\", "\\"),
                repr(value.encode("utf-8", "backslashreplace"))[2:-1],
            }
        )
    return {f for f in forms if len(f) >= MIN_SECRET_LENGTH}


def register_secret(secret: str | None) -> None:
    """Mask ``secret`` (in all its forms) in everything that leaves the process from now on."""
    global _pattern, _prefixes
    if not secret or not isinstance(secret, str):
        return
    forms = secret_forms(secret)
    with _lock:
        if forms <= _forms:
            return
        _forms.update(forms)
        # Longest first, so a form that contains another is masked whole.
        ordered = sorted(_forms, key=len, reverse=True)
        _pattern = re.compile("|".join(re.escape(f) for f in ordered))
        starts = sorted({f[:CUT_PREFIX] for f in _forms if len(f) > CUT_PREFIX})
        _prefixes = re.compile("|".join(re.escape(p) for p in starts)) if starts else None
    _install_log_factory()


def redact_secrets(text: str) -> str:
    """``text`` with every registered secret masked."""
    pattern, prefixes = _pattern, _prefixes
    if pattern is None or not text:
        return text
    text = pattern.sub(MASK, text)
    if prefixes is None or prefixes.search(text) is None:
        return text
    # What is left: the start of a form cut short by a length limit (or a near-copy of a key).
    out: list[str] = []
    pos = 0
    for match in prefixes.finditer(text):
        if match.start() < pos:
            continue
        out += [text[pos : match.start()], MASK]
        pos = match.start() + _cut_length(text, match.start())
    out.append(text[pos:])
    return "".join(out)


def _cut_length(text: str, start: int) -> int:
    """How many characters from ``start`` continue some registered form (at least CUT_PREFIX)."""
    best = 0
    for form in _forms:
        n = 0
        for a, b in zip(text[start:], form, strict=False):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return best


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
    global _pattern, _prefixes
    with _lock:
        _forms.clear()
        _pattern = _prefixes = None
