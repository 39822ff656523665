"""``recon-dagster orphans [--json] [--since DURATION] [--act]``: the orphan sweep, once, from a shell.

Without ``--act`` it writes nothing (no table, no cancel) and prints what it would do; with it,
it acts as the schedule does (shadowed kinds record what they would do).
"""

from __future__ import annotations

import json
import sys

from recon_dagster.cli.errors import CliError


def run_orphans(*, as_json: bool, since: str | None, act: bool) -> int:
    from recon_dagster.db.engine import get_engine, resolve_database_url
    from recon_dagster.operator.orphans import dry_run_providers, orphan_policy, parse_duration
    from recon_dagster.providers import providers_from_env
    from recon_dagster.reconcile.orphan_sweep import sweep_orphans

    try:
        window = parse_duration(since) if since is not None else None
    except ValueError as exc:
        raise CliError(str(exc), "e.g. --since 6h", code=2) from None
    providers = providers_from_env()
    if not act:
        providers = dry_run_providers(providers)
    try:
        report = sweep_orphans(
            get_engine(resolve_database_url()), providers, orphan_policy(act=act, since=window)
        )
    finally:
        providers.close()
    out = json.dumps(report.to_json(), indent=2, default=str) if as_json else report.to_text()
    sys.stdout.write(out + "\n")
    return 1 if report.errors else 0
