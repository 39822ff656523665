"""Which provider kinds recon_dagster enforces and which it only shadows, as configured
(``RECON_MODE``, ``RECON_ENFORCE_KINDS``, ``RECON_SHADOW_KINDS``; docs/rollout.md).

Read here, above the domain (which reads no settings), so the operator's actions and every Dagster
object (``defs.settings_check`` re-exports it) see the same modes.
"""

from __future__ import annotations

from collections.abc import Mapping

from recon_dagster import config
from recon_dagster.reconcile.shadow import (
    ENFORCE_KINDS_ENV,
    MODE_ENV,
    SHADOW_KINDS_ENV,
    Modes,
    modes_from_values,
)


def shadow_modes(environ: Mapping[str, str] | None = None) -> Modes:
    """``RECON_MODE`` / ``RECON_ENFORCE_KINDS`` / ``RECON_SHADOW_KINDS``, checked against the kinds."""
    return modes_from_values(
        config.get(MODE_ENV, environ), config.get(ENFORCE_KINDS_ENV, environ), config.get(SHADOW_KINDS_ENV, environ)
    )
