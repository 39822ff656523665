"""``recon-dagster orphans [--json] [--since DURATION] [--act]``: the orphan sweep, once, from a shell.

Without ``--act`` it writes nothing (no table, no cancel) and prints what it would do; with it,
it acts as the schedule does (shadowed kinds record what they would do).

``--adopt TASK --job JOB`` / ``--cancel TASK`` (``--reason``): the operator's word on a task the
sweep reported ``probably_ours``; recorded with who and why, as ``retry`` and ``fail`` are.
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


def run_hand_action(*, adopt: str | None, job: str | None, cancel: str | None, since: str | None,
                    reason: str) -> int:  # fmt: skip
    from recon_dagster.db.engine import get_engine, resolve_database_url
    from recon_dagster.operator.actions import OperatorError, os_user
    from recon_dagster.operator.orphans import adopt_probable, cancel_probable, orphan_policy, parse_duration
    from recon_dagster.providers import providers_from_env

    if (adopt is None) == (cancel is None):
        raise CliError("give one of --adopt or --cancel", "--adopt TASK --job JOB, or --cancel TASK", code=2)
    if adopt is not None and not job:
        raise CliError("--adopt TASK needs the job that takes it", "--adopt TASK --job JOB", code=2)
    if cancel is not None and job:
        raise CliError("--cancel TASK takes no --job", "drop --job: the task is cancelled upstream", code=2)
    try:
        window = parse_duration(since) if since is not None else None
    except ValueError as exc:
        raise CliError(str(exc), "e.g. --since 6h", code=2) from None
    policy = orphan_policy(act=True, since=window)
    engine = get_engine(resolve_database_url())
    providers = providers_from_env()
    try:
        if adopt is not None:
            done = adopt_probable(engine, providers, adopt, job or "", policy, who=os_user(), why=reason)
        else:
            done = cancel_probable(engine, providers, cancel or "", policy, who=os_user(), why=reason)
    except OperatorError as exc:
        raise CliError(str(exc), "see `recon-dagster orphans` for what the sweep found") from None
    finally:
        providers.close()
    sys.stdout.write(f"{'adopt' if adopt is not None else 'cancel'}: {done.line}\n")
    return 0
