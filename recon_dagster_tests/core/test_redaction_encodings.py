"""A key is masked in every encoding a provider or a serializer may echo it in.

The property: for a key of any characters (letters, digits, punctuation, spaces inside, non-ASCII,
astral), echoed inside surrounding text or JSON as JSON escapes (``\\uXXXX`` of any subset of its
characters in either hex case, ``\\/``, JSON inside JSON), URL-encoding (once or twice), HTML
character references, Python reprs, base64 / base64url (padded or not, alone or inside a larger
base64'd string such as ``Basic base64(user:key)``) or cut short, no run of ``RUN`` consecutive key
characters survives in the masked text, read back through any of those decodings.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Callable
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from recon_dagster.core.redaction import CUT_PREFIX, MASK, isolated_secrets, redact_secrets, register_secret
from recon_dagster_tests.support.redaction import RUN, runs

KEY_ALPHABET = "abcXYZ019" + "-_./+=:~!@$%&*" + " \"'\\<>#?;" + "é中😀"
keys = (
    st.text(alphabet=KEY_ALPHABET, min_size=RUN, max_size=48).map(str.strip).filter(lambda k: len(k) >= RUN)
)
texts = st.text(alphabet="abc xyz:{}\"'\\/%&#;=+-_01", max_size=24)


def _u(ch: str, upper: bool) -> str:
    code = ch.encode("utf-16-be")  # astral characters as a surrogate pair, as JSON spells them
    units = [int.from_bytes(code[i : i + 2], "big") for i in range(0, len(code), 2)]
    return "".join((f"\\u{u:04X}" if upper else f"\\u{u:04x}") for u in units)


@st.composite
def json_escaped(draw: st.DrawFn, key: str) -> str:
    """The key as a JSON string body: any subset of characters as ``\\u`` escapes (hex case
    mixed), ``/`` as ``\\/`` or as is, the rest as JSON must spell them."""
    out = []
    for ch in key:
        how = draw(st.sampled_from(["literal", "lower", "upper"]))
        if how != "literal":
            out.append(_u(ch, how == "upper"))
        elif ch == "/":
            out.append(draw(st.sampled_from(["/", "\\/"])))
        else:
            out.append(json.dumps(ch, ensure_ascii=False)[1:-1])
    return "".join(out)


@st.composite
def html_escaped(draw: st.DrawFn, key: str) -> str:
    out = []
    for ch in key:
        how = draw(st.sampled_from(["escape", "dec", "hex"]))
        out.append(
            html.escape(ch) if how == "escape" else f"&#{ord(ch)};" if how == "dec" else f"&#x{ord(ch):X};"
        )
    return "".join(out)


@st.composite
def base64ed(draw: st.DrawFn, key: str) -> str:
    """``base64(user + sep + key + tail)``: the key at any offset of a 3-byte group."""
    user = draw(st.text(alphabet="uvw", max_size=5))
    data = (user + draw(st.sampled_from(["", ":"])) + key + draw(st.text(alphabet="t", max_size=2))).encode()
    text = (base64.urlsafe_b64encode if draw(st.booleans()) else base64.b64encode)(data).decode()
    if draw(st.booleans()):
        text = text.rstrip("=")
    if draw(st.booleans()):  # inside a JSON string by an encoder that escapes '/'
        text = text.replace("/", "\\/")
    return ("Basic " if user else "") + text


ENCODINGS: dict[str, Callable[[str], st.SearchStrategy[str]]] = {
    "as is": st.just,
    "json": lambda k: st.just(json.dumps(k)[1:-1]),
    "json (unicode kept)": lambda k: st.just(json.dumps(k, ensure_ascii=False)[1:-1]),
    "json escapes, any subset": json_escaped,
    "json inside json": lambda k: st.just(json.dumps(json.dumps(k))[1:-1]),
    "url": lambda k: st.sampled_from([quote(k, safe=""), quote(k), quote_plus(k), quote(quote(k, safe=""))]),
    "html": html_escaped,
    "html twice": lambda k: st.just(html.escape(html.escape(k))),
    "repr": lambda k: st.sampled_from([repr(k)[1:-1], repr(k.encode())[2:-1]]),
    "base64": base64ed,
}


# --- the property -----------------------------------------------------------------------------


TEMPLATES = [
    "Invalid API key {} (rejected)",
    '{{"error": {{"message": "bad key {}", "code": 401}}}}',
    "GET /v1/x?api_key={}&page=2",
    "{}",
]


@st.composite
def echoes(draw: st.DrawFn) -> tuple[str, str, str]:
    """(key, message with the key echoed in some encoding, the same message with MASK instead)."""
    key = draw(keys)
    encoding = draw(st.sampled_from(sorted(ENCODINGS)))
    spelled = draw(ENCODINGS[encoding](key))
    template = draw(st.sampled_from(TEMPLATES))
    # A lone backslash right before the echo would escape its first character: not that echo.
    before, after = draw(texts.filter(lambda t: not t.endswith("\\"))), draw(texts)
    message = before + template.format(spelled) + after
    return key, message, before + template.format(MASK) + after


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(echo=echoes(), others=st.lists(keys, max_size=3))
# JSON inside JSON of a key with a character escaped in its middle.
@example(echo=("0000000é", 'key \\"0000000\\\\u00e9\\"', "key [redacted]"), others=[])
def test_no_run_of_a_key_survives_any_encoding(echo: tuple[str, str, str], others: list[str]) -> None:
    key, message, clean = echo
    with isolated_secrets():
        for other in others:  # other keys registered alongside change nothing
            register_secret(other)
        register_secret(key)
        masked = redact_secrets(message)
    leaked = runs(key, masked) - runs(key, clean)
    assert not leaked, f"{message!r} masked as {masked!r} still shows {sorted(leaked)[:5]}"


@settings(max_examples=200, deadline=None)
@given(
    key=keys, encoding=st.sampled_from(["as is", "json escapes, any subset", "url", "base64"]), data=st.data()
)
def test_a_key_cut_short_by_a_length_limit_is_masked_from_its_start(key: str, encoding: str, data) -> None:
    spelled = data.draw(ENCODINGS[encoding](key))
    keep = data.draw(st.integers(min_value=0, max_value=len(spelled)))
    message = "error: " + spelled[:keep]
    with isolated_secrets():
        register_secret(key)
        masked = redact_secrets(message)
    # What may survive is shorter than CUT_PREFIX characters: a public prefix such as "sk-proj-".
    leaked = runs(key, masked, CUT_PREFIX) - runs(key, "error: ", CUT_PREFIX)
    assert not leaked, f"{message!r} masked as {masked!r} still shows {sorted(leaked)[:5]}"


def test_the_issue_examples_are_masked() -> None:
    """A 33-character key with '/' echoed as '\\/', as \\u escapes, and as Basic base64."""
    key = "sk-live+Echo/Key=0123456789abcdef"
    with isolated_secrets():
        register_secret(key)
        escaped = "".join(f"\\u{ord(c):04x}" for c in key)
        slashed = key.replace("/", "\\/")
        basic = "Basic " + base64.b64encode(f"user:{key}".encode()).decode()
        for echoed in (escaped, escaped.upper().replace("\\U", "\\u"), slashed, basic):
            masked = redact_secrets(f'{{"error": "bad key {echoed}"}}')
            assert MASK in masked and not runs(key, masked), (echoed, masked)


def test_text_without_a_key_is_kept_byte_for_byte() -> None:
    key = "sk-proj-" + "A1b2C3d4E5f6G7h8"
    text = 'caf\\u00e9 \\/path %2F &amp; &#47; dXNlcjpwYXNz {"a": "\\"q\\""} \\\\u0041'
    with isolated_secrets():
        register_secret(key)
        assert redact_secrets(text) == text
