"""Every setting checked at once, when the definitions load and when the CLI starts, and the
domain's policies built from them.

The declarations, bounds and parsers are ``recon_dagster.config`` (docs/configuration.md is
generated from them); this adds the two checks that need a lower layer: a database URL as the
engine parses it, and shadow modes against the provider kinds. A bad value is a one-line
``ValueError`` naming its variable at start instead of a failed run, or a failed alert, hours
later. The domain (``recon_dagster.reconcile``) reads no settings itself: ``breaker_policy()`` and
``shadow_modes()`` build its policies here, for the definitions to pass in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from recon_dagster import config
from recon_dagster.config import Settings, settings
from recon_dagster.db.engine import (
    DATABASE_URL_ENV,
    DatabaseNotConfigured,
    InvalidDatabaseUrl,
    database_configured,
    normalize_url,
)
from recon_dagster.operator.modes import shadow_modes
from recon_dagster.reconcile.decide import BreakerPolicy

# Passed on from operator.modes: the defs read it here.
__all__ = ["shadow_modes"]

BURST_ENV = Settings.not_found_burst.name
SHARE_ENV = Settings.not_found_share.name
WINDOW_ENV = Settings.not_found_window_s.name


def breaker_policy(environ: Mapping[str, str] | None = None) -> BreakerPolicy:
    """The not-found breaker's policy: ``RECON_NOT_FOUND_BURST`` (5), ``RECON_NOT_FOUND_SHARE``
    (0.5), ``RECON_NOT_FOUND_WINDOW_S`` (600)."""
    now = settings(environ)
    return BreakerPolicy(
        burst=now.not_found_burst, share=now.not_found_share, window_s=now.not_found_window_s
    )


def _check_database_url(environ: Mapping[str, str]) -> None:
    """A URL the engine accepts; none at all only where the embedded server was asked for."""
    now = settings(environ)
    now.embedded_postgres  # noqa: B018  (a bad flag is named before a missing URL)
    if not database_configured(environ):
        raise DatabaseNotConfigured()
    raw = now.database_url
    if raw:
        try:
            normalize_url(raw)
        except InvalidDatabaseUrl as exc:
            raise ValueError(f"{DATABASE_URL_ENV}: {exc}") from None


def validate_settings(environ: Mapping[str, str] | None = None) -> None:
    """Raise a one-line ``ValueError`` naming the first bad setting (a missing ``RECON_DATABASE_URL``
    among them, unless the embedded server was asked for)."""
    env = dict(os.environ if environ is None else environ)
    _check_database_url(env)
    config.validate(env)
    shadow_modes(env)
