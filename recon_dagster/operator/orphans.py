"""The orphan sweep as the operator and Dagster run it: the settings read, the providers wired.

``orphan_policy`` reads ``RECON_ORPHAN_WINDOW_S`` / ``RECON_ORPHAN_GRACE_S`` and the modes (the
domain reads no settings); ``dry_run_providers`` are the providers with per-process limits only,
so a dry run writes nothing at all, not even the account limiter's shared rows.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from recon_dagster.config import settings
from recon_dagster.operator.modes import shadow_modes
from recon_dagster.reconcile.orphan_sweep import SweepPolicy

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.I)
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW = timedelta(days=30)


def parse_duration(text: str) -> timedelta:
    """``90``, ``90s``, ``30m``, ``6h``, ``2d``: a positive duration of at most 30 days."""
    match = _DURATION.match(text or "")
    if match is None:
        raise ValueError(f"--since must be a duration like 30m, 6h or 2d, got {text!r}")
    value = timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2).lower()])
    if not timedelta(0) < value <= MAX_WINDOW:
        raise ValueError(f"--since must be more than 0 and at most 30d, got {text!r}")
    return value


def orphan_policy(*, act: bool, since: timedelta | None = None, run_id: str | None = None) -> SweepPolicy:
    now = settings()
    return SweepPolicy(
        window=since or timedelta(seconds=now.orphan_window_s),
        grace=timedelta(seconds=now.orphan_grace_s),
        act=act,
        shadowed=shadow_modes().shadowed,
        run_id=run_id,
    )


def dry_run_providers(providers: Any) -> Any:
    """``providers`` with each resource's account budget kept in this process (a dry run must not
    write the shared limiter's rows)."""
    update = {
        name: resource.model_copy(update={"shared_limits": False})
        for name in ("kie", "replicate", "elevenlabs", "anthropic")
        if (resource := getattr(providers, name, None)) is not None
    }
    return providers.model_copy(update=update)
