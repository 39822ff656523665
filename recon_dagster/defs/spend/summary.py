"""The day's spend across providers: one partitioned asset whose numbers Dagster plots per day
(its Plots tab: spend by provider over time), read from each provider asset's materialization of
the same day."""

from typing import Any

import dagster as dg

from recon_dagster.defs.spend.assets import PROVIDER_ASSETS
from recon_dagster.defs.spend.reports import GROUP, daily

SUMMARY = dg.AssetKey("spend_summary")
SERIES = ("provider_amount", "our_amount", "difference", "our_cost_usd", "findings")


def _latest(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str) -> dict[str, Any] | None:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
    ).records
    materialization = records[0].asset_materialization if records else None
    return dict(materialization.metadata) if materialization else None


@dg.asset(
    key=SUMMARY,
    group_name=GROUP,
    partitions_def=daily,
    deps=list(PROVIDER_ASSETS.values()),
    description="Spend by provider for the day, from each provider's spend asset: what the "
    "provider billed (provider_amount/<provider>, in its unit), what we charged for "
    "(our_amount/<provider>), the judged difference, our recorded provider cost in USD and the "
    "findings. Plotted per day; a provider not reconciled that day is listed under 'missing'.",
)
def spend_summary(context: dg.AssetExecutionContext) -> dg.MaterializeResult[Any]:
    partition = context.partition_key
    meta: dict[str, Any] = {}
    rows = [
        "| provider | unit | billed | ours | difference | our cost (USD) | findings | check |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    missing, total_cost, red = [], 0.0, []
    for provider, key in PROVIDER_ASSETS.items():
        found = _latest(context.instance, key, partition)
        if found is None:
            missing.append(provider)
            continue
        values = {name: getattr(found.get(name), "value", None) for name in SERIES}
        for name, value in values.items():
            if isinstance(value, int | float):
                meta[f"{name}/{provider}"] = (
                    dg.MetadataValue.int(int(value))
                    if name == "findings"
                    else dg.MetadataValue.float(float(value))
                )
        total_cost += float(values["our_cost_usd"] or 0.0)
        unit = getattr(found.get("unit"), "value", "")
        judged = getattr(found.get("summary"), "value", "")
        rows.append(
            f"| {provider} | {unit} | {values['provider_amount']} | {values['our_amount']} | "
            f"{values['difference']} | {values['our_cost_usd']} | {values['findings']} | {str(judged).replace('|', '/')} |"
        )
        if values["findings"]:
            red.append(provider)
    meta["our_cost_usd/total"] = dg.MetadataValue.float(total_cost)
    meta["providers"] = dg.MetadataValue.md("\n".join(rows))
    meta["missing"] = ", ".join(missing) or "none"
    meta["with_findings"] = ", ".join(red) or "none"
    return dg.MaterializeResult(metadata=meta)
