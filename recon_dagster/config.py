"""Reading ``RECON_*`` settings: one parser for numbers within bounds, one for the alert hook.

The bottom layer: it imports nothing of recon_dagster, so every layer may read its settings
through it. A bad value is a one-line ``ValueError`` naming its variable.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

ALERT_HOOK_ENV = "RECON_ALERT_HOOK"

# Upper bounds of the reconcile knobs (README, Configuration); lower bounds are in the table below.
_KNOBS: tuple[tuple[str, type, float, float], ...] = (
    ("RECON_MAX_ATTEMPTS", int, 1, 1000),
    ("RECON_RECONCILE_CADENCE_S", float, 0, 7 * 86400),
    ("RECON_LEASE_S", float, 1, 7 * 86400),
    ("RECON_RECONCILE_CONCURRENCY", int, 1, 1000),
    ("RECON_BATCH_SIZE", int, 1, 100_000),
    ("RECON_SINGLE_RUN_BELOW", int, 0, 100_000),
    ("RECON_SCAN_LIMIT", int, 1, 1_000_000),
    ("RECON_DB_POOL_SIZE", int, 1, 1000),
    ("RECON_DB_MAX_OVERFLOW", int, 0, 1000),
)


def bounded_number(name: str, raw: str, cast: type, low: float, high: float) -> Any:
    """``raw`` as ``cast`` within ``[low, high]`` (finite), else a ``ValueError`` naming ``name``."""
    what = "a whole number" if cast is int else "a number"
    try:
        value = cast(raw.strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{name} must be {what} from {low:g} to {high:g}, got {raw.strip()!r}")
    return value


def knob(name: str, fallback: float, cast: type, environ: Mapping[str, str] | None = None) -> Any:
    """One reconcile knob from the environment (``fallback`` when unset), within its bounds."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return cast(fallback)
    _, _, low, high = next(k for k in _KNOBS if k[0] == name)
    return bounded_number(name, raw, cast, low, high)


def check_knobs(environ: Mapping[str, str]) -> None:
    for name, cast, _, _ in _KNOBS:
        knob(name, 0, cast, environ)


def load_alert_hook(environ: Mapping[str, str] | None = None) -> Callable[..., Any] | None:
    """``RECON_ALERT_HOOK=package.module:function`` imported and checked callable (None: unset)."""
    spec = (os.environ if environ is None else environ).get(ALERT_HOOK_ENV, "").strip()
    if not spec:
        return None
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"{ALERT_HOOK_ENV} must look like package.module:function, got {spec!r}")
    try:
        hook = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ValueError(f"{ALERT_HOOK_ENV}: cannot import module {module!r} ({exc})") from None
    except AttributeError:
        raise ValueError(f"{ALERT_HOOK_ENV}: module {module!r} has no {name!r}") from None
    if not callable(hook):
        raise ValueError(f"{ALERT_HOOK_ENV}: {spec!r} is a {type(hook).__name__}, not a function")
    return hook
