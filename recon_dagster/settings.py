"""Every ``RECON_*`` setting checked at once, when the definitions load and when the CLI starts.

Each setting is still read where it is used (a later change gathers them into one module); this
calls every reader, so a bad value is a one-line ``ValueError`` naming its variable at start
instead of a failed run, or a failed alert, hours later. The bounds live with each reader and in
README's configuration table.
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


def _check_ui_url(environ: Mapping[str, str]) -> None:
    raw = environ.get("RECON_DAGSTER_UI_URL", "").strip()
    if raw and not raw.startswith(("http://", "https://")):
        raise ValueError(f"RECON_DAGSTER_UI_URL must start with http:// or https://, got {raw!r}")


def _check_database_url(environ: Mapping[str, str]) -> None:
    from recon_dagster.db.engine import DATABASE_URL_ENV, InvalidDatabaseUrl, normalize_url

    raw = environ.get(DATABASE_URL_ENV, "").strip()
    if raw:
        try:
            normalize_url(raw)
        except InvalidDatabaseUrl as exc:
            raise ValueError(f"{DATABASE_URL_ENV}: {exc}") from None


def validate_settings(environ: Mapping[str, str] | None = None) -> None:
    """Raise a one-line ``ValueError`` naming the first bad ``RECON_*`` setting."""
    from recon_dagster import deadlines
    from recon_dagster.breaker import policy_from_env
    from recon_dagster.kinds import precall_budget
    from recon_dagster.media.download import allowed_hosts_from_env
    from recon_dagster.providers.limits import (
        DEFAULT_LIMITS,
        account_limits_from_env,
        budget_migration_requested,
        shared_limits_enabled,
    )
    from recon_dagster.sensors import sensor_interval_s

    env = dict(os.environ if environ is None else environ)
    _check_database_url(env)
    check_knobs(env)
    for reader in (
        deadlines.poll_deadline_s,
        deadlines.poll_max_bytes,
        deadlines.media_deadline_s,
        deadlines.media_min_bytes_per_s,
    ):
        reader(env)
    policy_from_env(env)
    precall_budget(env)
    allowed_hosts_from_env(env)
    sensor_interval_s(env)
    shared_limits_enabled(env)
    budget_migration_requested(env)
    for provider in DEFAULT_LIMITS:
        account_limits_from_env(provider, env)
    _check_ui_url(env)
    load_alert_hook(env)
