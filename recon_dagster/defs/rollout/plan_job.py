"""``plan_reconcile``: ``recon-dagster plan`` from the Launchpad. The run shows the plan's table and
totals, and the orphan sweep's dry run, as metadata; like the command it writes nothing
(``recon_dagster.reconcile.plan``, ``recon_dagster.reconcile.orphan_sweep``)."""

from typing import Any

import dagster as dg
from pydantic import Field

from recon_dagster.core.kinds import KINDS
from recon_dagster.core.runtags import ROLE_TAG
from recon_dagster.defs.resources import DatabaseResource, ReconcileSettingsResource
from recon_dagster.providers import ProvidersResource
from recon_dagster.reconcile.plan import build_plan, to_markdown, totals_lines


class PlanConfig(dg.Config):
    kind: str | None = Field(default=None, description="Only this provider kind (default: every kind).")
    no_poll: bool = Field(default=False, description="Ask no provider: decide only what the rows decide.")


@dg.op(out=dg.Out(dict))
def plan_reconcile_table(
    context: dg.OpExecutionContext,
    config: PlanConfig,
    database: DatabaseResource,
    providers: ProvidersResource,
    reconcile_settings: ReconcileSettingsResource,
) -> dg.Output[dict[str, Any]]:
    """What the next tick would do to every in-flight job and every credit; writes nothing."""
    from recon_dagster.defs.reconcile.sensors import jobs_in_active_runs
    from recon_dagster.defs.settings_check import shadow_modes

    if config.kind is not None and config.kind not in KINDS:
        raise dg.Failure(
            description=f"unknown provider kind {config.kind!r}; use one of: {', '.join(sorted(KINDS))}",
            allow_retries=False,
        )
    plan = build_plan(
        database.get_engine(),
        None if config.no_poll else providers,
        reconcile_settings.settings(),
        kind=config.kind,
        limit=reconcile_settings.scan_limit,
        busy=jobs_in_active_runs(context.instance),
        shadowed=shadow_modes().shadowed,
    )
    for line in totals_lines(plan):
        context.log.info(line)
    data = plan.to_json()
    totals = data["totals"]
    metadata: dict[str, Any] = {
        "plan": dg.MetadataValue.md(to_markdown(plan)),
        "jobs": len(plan.jobs),
        "by_action": dg.MetadataValue.json(totals["by_action"]),
        "by_kind": dg.MetadataValue.json(totals["by_kind"]),
        "credits": dg.MetadataValue.json(totals["credits"]),
    }
    if not config.no_poll:
        # What the orphan sweep would do to the providers' recent tasks, as `recon-dagster plan`
        # shows it: a dry run, nothing written or cancelled.
        from recon_dagster.operator.orphans import orphan_policy
        from recon_dagster.reconcile.orphan_sweep import sweep_orphans

        orphans = sweep_orphans(database.get_engine(), providers, orphan_policy(act=False))
        shown = orphans.to_text()
        context.log.info(shown)
        metadata["orphans"] = dg.MetadataValue.md(f"```\n{shown}\n```")
        metadata["orphan_actions"] = dg.MetadataValue.json(dict(orphans.counts()))
    return dg.Output(totals, metadata=metadata)


@dg.job(
    executor_def=dg.in_process_executor,
    description="Plan, writing nothing: for every job the next tick would take, what reconciliation would "
    "do and why (complete and commit / fail and refund per pool / count / force-fail / sweep / leave "
    "alone), with totals, and what the orphan sweep would do to the providers' recent tasks. Config: "
    "ops.plan_reconcile_table.config.kind, no_poll.",
    tags={ROLE_TAG: "plan"},
)
def plan_reconcile() -> None:
    plan_reconcile_table()
