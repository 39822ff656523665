"""The parsers of recon_dagster's settings: ``(variable, stripped non-empty value) -> value``, or a
one-line ``ValueError`` naming the variable. ``recon_dagster.config`` declares which variable
each one parses."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from typing import Any

Parse = Callable[[str, str], Any]  # (variable, stripped non-empty value) -> value


class LimitsConfigError(ValueError):
    """A malformed ``RECON_LIMITS``, ``RECON_LIMITS_MIGRATE`` or ``RECON_LIMIT_<PROVIDER>`` value; the
    message names the variable."""


def shown_number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def bounded_number(name: str, raw: str, cast: type, low: float, high: float) -> Any:
    """``raw`` as ``cast`` within ``[low, high]`` (finite), else a ``ValueError`` naming ``name``."""
    what = "a whole number" if cast is int else "a number"
    try:
        value = cast(raw.strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(
            f"{name} must be {what} from {shown_number(low)} to {shown_number(high)}, got {raw.strip()!r}"
        )
    return value


def knob(cast: type, low: float, high: float) -> Parse:
    return lambda name, raw: bounded_number(name, raw, cast, low, high)


def positive(cast: type, what: str = "a positive finite number") -> Parse:
    """A positive finite number (the I/O deadlines and caps); the error says ``what``."""

    def parse(name: str, raw: str) -> Any:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be {what}, got {raw!r}")
        return cast(value)

    return parse


def choice(
    choices: Mapping[str, Any],
    expected: str,
    error: type[ValueError] = ValueError,
    *,
    echo_as_given: bool = False,
) -> Parse:
    """One of ``choices`` (case-insensitive); the error echoes the value lowercased unless
    ``echo_as_given``."""

    def parse(name: str, raw: str) -> Any:
        key = raw.lower()
        if key not in choices:
            raise error(f"{name} must be {expected}, got {raw if echo_as_given else key!r}")
        return choices[key]

    return parse


# A flag that must say what it means: anything else is an error naming the variable.
FLAG_VALUES = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
FLAG_BOUNDS = "`1`/`true`/`yes`, `0`/`false`/`no`"


def lenient_flag(name: str, raw: str) -> bool:
    """``1`` / ``true`` / ``yes`` switch it on; anything else leaves it off (never an error)."""
    return raw.lower() in ("1", "true", "yes")


def name_list(name: str, raw: str) -> frozenset[str]:
    return frozenset(k.strip() for k in raw.split(",") if k.strip())


def http_url(name: str, raw: str) -> str:
    if not raw.startswith(("http://", "https://")):
        raise ValueError(f"{name} must start with http:// or https://, got {raw!r}")
    return raw.rstrip("/")


def authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def host_list(name: str, value: str) -> frozenset[str]:
    """Parse ``host[:port],host[:port]`` into normalised entries; blanks are ignored.

    IPv6 hosts are written in brackets (``[::1]:8080``). Raises ``ValueError`` naming ``name`` and
    a bad entry.
    """
    entries: set[str] = set()
    for raw in value.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        host, port = _split_host_port(name, entry)
        if not host:
            raise ValueError(f"{name}: entry {raw.strip()!r} has no host")
        entries.add(authority(host, port) if port is not None else host)
    return frozenset(entries)


def _split_host_port(name: str, entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"{name}: bad entry {entry!r}")
    elif entry.count(":") == 1:
        host, _, port_text = entry.partition(":")
    else:
        # A bare IPv6 address without brackets, or a plain host.
        host, port_text = entry, ""
    if not port_text:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{name}: bad port in entry {entry!r}")

    return host, int(port_text)


# Bounds of a configured budget: beyond them a value is a typo, and an absurd one hangs the
# account (a billion slot rows, a window of a nanosecond or of forever).
MAX_REQUESTS = 1_000_000
MIN_WINDOW_S = 1.0
MAX_WINDOW_S = 86_400.0
MAX_CONCURRENCY = 1_000
UNLIMITED = ("none", "off")


def _parse_budget(name: str, text: str) -> tuple[int, float] | None:
    if text.lower() in UNLIMITED:
        return None
    count, _, window = text.partition("/")
    shape = f"{name}: a budget is N/SECONDS (e.g. 600/60) or none"
    try:
        requests = int(count)
        window_s = float(window.removesuffix("s") or 60)
    except ValueError:
        raise LimitsConfigError(f"{shape}, got {text!r}") from None
    if not 1 <= requests <= MAX_REQUESTS:
        raise LimitsConfigError(
            f"{shape}, with N from 1 to {MAX_REQUESTS} ('none' for unlimited), got {text!r}"
        )
    if not (math.isfinite(window_s) and MIN_WINDOW_S <= window_s <= MAX_WINDOW_S):
        raise LimitsConfigError(
            f"{shape}, with SECONDS from {MIN_WINDOW_S:g} to {MAX_WINDOW_S:g}, got {text!r}"
        )
    return requests, window_s


def _parse_concurrency(name: str, value: str) -> int | None:
    if value.lower() in UNLIMITED:
        return None
    if not value.isdigit() or not 1 <= int(value) <= MAX_CONCURRENCY:
        raise LimitsConfigError(
            f"{name}: concurrency is a whole number from 1 to {MAX_CONCURRENCY} or none, got {value!r}"
        )
    return int(value)


def parse_limit_overrides(name: str, raw: str) -> dict[str, Any]:
    """``RECON_LIMIT_<PROVIDER>``: comma-separated ``reads=N/S``, ``creates=N/S``,
    ``concurrency=N|none``, ``kind_share=F``, ``account=NAME``, as the fields they override
    (budgets as ``(requests, window_s)`` or None). ``none`` is the only way to say unlimited."""
    fields: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not value:
            raise LimitsConfigError(f"{name}: expected key=value, got {part!r}")
        if key in ("reads", "creates"):
            fields[key] = _parse_budget(name, value)
        elif key == "concurrency":
            fields[key] = _parse_concurrency(name, value)
        elif key == "kind_share":
            try:
                share = float(value)
            except ValueError:
                share = math.nan
            if not 0 < share <= 1:  # NaN fails this too
                raise LimitsConfigError(f"{name}: kind_share must be a number in (0, 1], got {value!r}")
            fields[key] = share
        elif key == "account":
            fields[key] = value
        else:
            raise LimitsConfigError(
                f"{name}: unknown field {key!r} (reads, creates, concurrency, kind_share, account)"
            )
    return fields


def importable_hook(name: str, spec: str) -> Callable[..., Any]:
    """``package.module:function`` imported and checked callable."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"{name} must look like package.module:function, got {spec!r}")
    try:
        hook: object = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise ValueError(f"{name}: cannot import module {module!r} ({exc})") from None
    except AttributeError:
        raise ValueError(f"{name}: module {module!r} has no {attr!r}") from None
    if not callable(hook):
        raise ValueError(f"{name}: {spec!r} is a {type(hook).__name__}, not a function")
    return hook


def text(name: str, raw: str) -> str:
    return raw
