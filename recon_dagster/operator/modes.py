"""Which provider kinds recon_dagster enforces and which it only shadows, as configured
(``RECON_MODE``, ``RECON_ENFORCE_KINDS``, ``RECON_SHADOW_KINDS``; docs/rollout.md).

Read here, above the domain (which reads no settings), so the operator's actions and every Dagster
object (``defs.settings_check`` re-exports it) see the same modes.
"""

from __future__ import annotations

from collections.abc import Mapping

from recon_dagster.config import Settings, settings
from recon_dagster.reconcile.shadow import Modes, modes_from_values


def shadow_modes(environ: Mapping[str, str] | None = None) -> Modes:
    """``RECON_MODE`` / ``RECON_ENFORCE_KINDS`` / ``RECON_SHADOW_KINDS``, checked against the kinds."""
    now = settings(environ)
    return modes_from_values(
        now.mode,
        now.enforce_kinds,
        now.shadow_kinds,
        names=(Settings.enforce_kinds.name, Settings.shadow_kinds.name),
    )
