"""``recon-dagster plan``: print the plan (``recon_dagster.reconcile.plan``) or the shadow agreement report."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from recon_dagster.cli.errors import CliError
from recon_dagster.core.kinds import KINDS


def run_plan(
    *, kind: str | None, as_json: bool, no_poll: bool, shadow_report: bool, limit: int | None
) -> int:
    from recon_dagster.db.engine import get_engine, resolve_database_url
    from recon_dagster.defs.resources import ReconcileSettingsResource
    from recon_dagster.defs.settings_check import shadow_modes
    from recon_dagster.reconcile.plan import build_plan, to_text

    if kind is not None and kind not in KINDS:
        raise CliError(f"unknown provider kind {kind!r}", f"use one of: {', '.join(sorted(KINDS))}", code=2)
    engine = get_engine(resolve_database_url())
    if shadow_report:
        from recon_dagster.defs.rollout.agreement import agreement_report, report_text

        report = agreement_report(engine, kind=kind)
        _emit(report.to_json() if as_json else report_text(report), as_json)
        return 1 if report.harmful else 0
    resource = ReconcileSettingsResource.from_config()
    upstream: Any = None
    if not no_poll:
        from recon_dagster.providers import providers_from_env

        upstream = providers_from_env()
    plan = build_plan(
        engine,
        upstream,
        resource.settings(),
        kind=kind,
        limit=limit or resource.scan_limit,
        busy=_in_active_runs(),
        shadowed=shadow_modes().shadowed,
    )
    orphans = None if upstream is None else _orphan_plan(engine, upstream)
    from recon_dagster.providers.resource import not_configured, not_configured_line

    # A provider without its key: one line each, first (the sensor requests no run for its kinds).
    missing = [not_configured_line(p) for p in not_configured()]
    if as_json:
        _emit(
            {**plan.to_json(), "orphans": orphans.to_json() if orphans else None, "not_configured": missing},
            as_json,
        )
    else:
        head = "".join(f"{line}\n" for line in missing) + ("\n" if missing else "")
        _emit(head + to_text(plan) + ("\n\n" + orphans.to_text() if orphans else ""), as_json)
    return 0


def _orphan_plan(engine: Any, upstream: Any) -> Any:
    """What the orphan sweep would do to the providers' recent tasks (nothing written)."""
    from recon_dagster.operator.orphans import orphan_policy
    from recon_dagster.reconcile.orphan_sweep import sweep_orphans

    return sweep_orphans(engine, upstream, orphan_policy(act=False))


def _in_active_runs() -> set[Any]:
    """Jobs carried by queued or running reconcile runs of ``$DAGSTER_HOME``'s instance (left
    alone, as the sensor does); without an instance, none."""
    if not os.environ.get("DAGSTER_HOME"):
        return set()
    import dagster as dg

    from recon_dagster.defs.reconcile.sensors import jobs_in_active_runs

    with dg.DagsterInstance.get() as instance:
        return jobs_in_active_runs(instance)


def _emit(value: Any, as_json: bool) -> None:
    sys.stdout.write((json.dumps(value, indent=2, default=str) if as_json else str(value)) + "\n")
