"""Every ``RECON_*`` setting checked at once, when the definitions load and when the CLI starts.

Each setting is still read where it is used (a later change gathers them into one module); this
calls every reader, so a bad value is a one-line ``ValueError`` naming its variable at start
instead of a failed run, or a failed alert, hours later. The bounds live with each reader and in
README's configuration table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from recon_dagster.config import check_knobs, load_alert_hook  # noqa: F401  (re-exported)


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
    from recon_dagster.core import deadlines
    from recon_dagster.core.kinds import precall_budget
    from recon_dagster.defs.reconcile.sensors import sensor_interval_s
    from recon_dagster.media.download import allowed_hosts_from_env
    from recon_dagster.providers.limits import (
        DEFAULT_LIMITS,
        account_limits_from_env,
        budget_migration_requested,
        shared_limits_enabled,
    )
    from recon_dagster.reconcile.breaker import policy_from_env

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
