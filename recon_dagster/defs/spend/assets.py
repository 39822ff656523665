"""Spend reconciliation per provider and day: one partitioned asset each, carrying the check that
turns red when the provider's bill and our charges differ beyond the setting's tolerance.

Each reads the provider's own record through the provider resource's HTTP client (its limits,
deadlines and redaction) and our side from ``usage_logs`` and the create ledger; none writes
anything but its own materialization.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from recon_dagster.config import Settings, settings
from recon_dagster.db import balance_samples
from recon_dagster.db import spend as our_side
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.defs.spend.reports import GROUP, check_spec, daily, now, result, window
from recon_dagster.providers import ProvidersResource
from recon_dagster.providers.anthropic.spend import AnthropicUsageResource
from recon_dagster.providers.elevenlabs.spend import ElevenLabsSpend
from recon_dagster.providers.kie.spend import KieSpend
from recon_dagster.providers.upstream_tasks import TaskListing
from recon_dagster.reconcile.spend import SpendReport, match_kie, match_replicate
from recon_dagster.reconcile.spend_usage import is_final, match_anthropic, match_elevenlabs

REPLICATE = dg.AssetKey("replicate_spend")
ELEVENLABS = dg.AssetKey("elevenlabs_spend")
ANTHROPIC = dg.AssetKey("anthropic_spend")
KIE = dg.AssetKey("kie_spend")
PROVIDER_ASSETS = {"replicate": REPLICATE, "elevenlabs": ELEVENLABS, "anthropic": ANTHROPIC, "kie": KIE}
# Replicate's tasks listed this far past either end of the day, only to find a charged job's
# task created across midnight (they count to the day they were created in), on top of the
# longest a job may wait between its charge and its create (``listing_margin``).
MIDNIGHT_MARGIN = timedelta(hours=1)
# A KIE sample refused this many times in a row (each time another run had just taken one) fails
# the run: that many runs at once is a misconfigured backfill, not something to wait out.
SAMPLE_TRIES = 5


def listing_margin(precall_budget_s: float) -> timedelta:
    """How far past either end of the day charges and tasks are read: a job is charged when it is
    reserved and may wait up to the pre-call budget before its create, so its task may be created
    that long after midnight (or its charge taken that long before), plus ``MIDNIGHT_MARGIN``."""
    return timedelta(seconds=precall_budget_s) + MIDNIGHT_MARGIN


@dg.asset(
    key=REPLICATE,
    group_name=GROUP,
    partitions_def=daily,
    kinds={"replicate", "postgres"},
    check_specs=[check_spec(REPLICATE, "seconds", Settings.spend_replicate_tolerance_s.name)],
    description="Replicate's predictions and trainings of the day (its list endpoints) with their "
    "metrics.predict_time, matched to the create ledger's task ids and the day's charges: billed "
    "seconds nobody was charged for (unknown, orphaned or refunded tasks), jobs charged whose task "
    "Replicate never listed, compute seconds per model.",
)
def replicate_spend(
    context: dg.AssetExecutionContext, providers: ProvidersResource, database: DatabaseResource
) -> dg.MaterializeResult:  # type: ignore[type-arg]  # Dagster reads a bare annotation only, with check specs
    start, end = window(context)
    tolerance = settings().spend_replicate_tolerance_s
    resource: object = providers.provider("replicate")
    if not isinstance(resource, TaskListing):
        report = SpendReport(
            provider="replicate", unit="seconds", provider_amount=0.0, our_amount=0.0,
            tolerance=tolerance, configured=False, note="this Replicate resource cannot list its tasks",
        )  # fmt: skip
        return result(report)
    margin = listing_margin(settings().precall_budget_s)
    tasks = list(resource.list_tasks(created_after=start - margin, created_before=end + margin))
    with database.get_engine().connect() as conn:
        charges = our_side.charges(conn, "replicate", start - margin, end + margin)
        owners = our_side.owners(conn, "replicate", [t.task_id for t in tasks])
    report = match_replicate(tasks, owners, charges, start=start, end=end, tolerance_s=tolerance)
    context.log.info(report.line())
    return result(report, {"tasks_listed": dg.MetadataValue.int(len(tasks))})


@dg.asset(
    key=ELEVENLABS,
    group_name=GROUP,
    partitions_def=daily,
    kinds={"elevenlabs", "postgres"},
    check_specs=[check_spec(ELEVENLABS, "characters", Settings.spend_elevenlabs_tolerance_chars.name)],
    description="ElevenLabs' characters of the day (GET /v1/usage/character-stats) and its history "
    "(GET /v1/history, per request_id) against the characters our TTS and dubbing jobs recorded "
    "(usage_logs.metadata.characters and request_id).",
)
def elevenlabs_spend(
    context: dg.AssetExecutionContext, providers: ProvidersResource, database: DatabaseResource
) -> dg.MaterializeResult:  # type: ignore[type-arg]  # Dagster reads a bare annotation only, with check specs
    start, end = window(context)
    resource = providers.provider("elevenlabs")
    if not isinstance(resource, ElevenLabsSpend):
        raise TypeError("the elevenlabs resource cannot read its history")
    items = list(resource.history(start, end))
    stats = resource.character_stats(start, end)
    with database.get_engine().connect() as conn:
        charges = our_side.charges(conn, "elevenlabs", start, end)
    report = match_elevenlabs(
        items, stats, charges, tolerance_chars=settings().spend_elevenlabs_tolerance_chars
    )
    context.log.info(report.line())
    return result(report, {"history_items": dg.MetadataValue.int(len(items))})


@dg.asset(
    key=ANTHROPIC,
    group_name=GROUP,
    partitions_def=daily,
    kinds={"anthropic", "postgres"},
    check_specs=[check_spec(ANTHROPIC, "tokens", Settings.spend_anthropic_tolerance_tokens.name)],
    description="Anthropic's usage report of the day (Admin API, hourly buckets per model and API "
    "key) against the tokens our sync calls recorded (usage_logs.metadata.model, input_tokens, "
    "output_tokens). Judged only once final: "
    f"{Settings.spend_anthropic_final_after_s.name} after the day ends. Without an admin key "
    "(ANTHROPIC_ADMIN_API_KEY) it reports 'not configured'.",
)
def anthropic_spend(
    context: dg.AssetExecutionContext, anthropic_usage: AnthropicUsageResource, database: DatabaseResource
) -> dg.MaterializeResult:  # type: ignore[type-arg]  # Dagster reads a bare annotation only, with check specs
    start, end = window(context)
    return anthropic_report(context, anthropic_usage, database, start, end)


def anthropic_report(
    context: dg.AssetExecutionContext,
    usage: AnthropicUsageResource,
    database: DatabaseResource,
    start: datetime,
    end: datetime,
) -> dg.MaterializeResult[Any]:
    """Anthropic's usage of ``[start, end)`` against our recorded tokens, final once the report's
    delay has passed since ``end``."""
    delay = settings().spend_anthropic_final_after_s
    final = is_final(end, now(), delay)
    buckets = usage.usage_report(start, end) if usage.configured else None
    with database.get_engine().connect() as conn:
        charges = our_side.charges(conn, "anthropic", start, end)
    final_at = end + timedelta(seconds=delay)
    note = "" if final else f"final at {final_at:%Y-%m-%d %H:%M} UTC"
    report = match_anthropic(
        buckets, charges, final=final, tolerance_tokens=settings().spend_anthropic_tolerance_tokens, note=note
    )
    context.log.info(report.line())
    return result(report, {"final_at": final_at.isoformat()})


@dg.asset(
    key=KIE,
    group_name=GROUP,
    partitions_def=daily,
    kinds={"kie", "postgres"},
    check_specs=[check_spec(KIE, "credits", Settings.spend_kie_tolerance_credits.name)],
    description="KIE's credit balance (GET /api/v1/chat/credit), sampled when the partition is "
    "materialized; its change since the previous sample against the credits our KIE jobs of that "
    "window recorded (usage_logs.metadata.provider_credits, refunded jobs left out), naming the "
    "ledger's KIE tasks no live charge pays for. KIE has no per-task billing API. A sample is "
    "measured from once (recon_balance_samples): runs at once measure one window each, never the same.",
)
def kie_spend(
    context: dg.AssetExecutionContext, providers: ProvidersResource, database: DatabaseResource
) -> dg.MaterializeResult:  # type: ignore[type-arg]  # Dagster reads a bare annotation only, with check specs
    kie = providers.provider("kie")
    if not isinstance(kie, KieSpend):
        raise TypeError("the kie resource cannot read its credit balance")
    engine = database.get_engine()
    for _ in range(SAMPLE_TRIES):
        # The chain's head first, then the balance: a sample another run adds in between makes
        # this one's write refused below, and the balance is read again after it.
        with engine.connect() as conn:
            head = balance_samples.latest(conn, "kie")
        previous = (head.balance, head.sampled_at) if head else _previous_sample(context.instance)
        balance = kie.credit_balance()
        sampled_at = now()
        since = previous[1] if previous else window(context)[0]
        with engine.begin() as conn:
            taken = balance_samples.record(
                conn, "kie", balance, sampled_at, head,
                run_id=context.run.run_id, partition=context.partition_key,
            )  # fmt: skip
            if taken is None:
                context.log.info(
                    "another run sampled KIE's balance from the same sample at the same time: "
                    "sampling again from the one it took"
                )
                continue
            # In the sample's transaction: a run that fails here leaves no sample behind.
            charges = our_side.charges(conn, "kie", since, sampled_at)
            unpaid = our_side.creates_without_charge(conn, "kie", since, sampled_at)
        break
    else:
        raise SampleRefused(
            f"kie_spend: {SAMPLE_TRIES} balance samples in a row were refused (other runs sampled KIE's "
            "balance at the same time); run it again"
        )
    report = match_kie(
        previous[0] if previous else None, balance, charges, unpaid,
        tolerance_credits=settings().spend_kie_tolerance_credits,
    )  # fmt: skip
    context.log.info(report.line())
    return result(
        report,
        {
            "balance": dg.MetadataValue.float(balance),
            "sampled_at": dg.MetadataValue.float(sampled_at.timestamp()),
            "sample": dg.MetadataValue.int(taken.id),
            "window": f"{since.isoformat()} .. {sampled_at.isoformat()}",
        },
    )


class SampleRefused(RuntimeError):
    """Every try at a KIE balance sample was refused: other runs kept extending the chain."""


def _previous_sample(instance: dg.DagsterInstance) -> tuple[float, datetime] | None:
    """The balance and time of the latest sample Dagster recorded (any partition): where the first
    sample of ``recon_balance_samples`` starts, so its window follows the samples taken before
    the table existed."""
    records = instance.fetch_materializations(KIE, limit=1).records
    if not records:
        return None
    materialization = records[0].asset_materialization
    meta = materialization.metadata if materialization else {}
    balance, at = meta.get("balance"), meta.get("sampled_at")
    if not isinstance(balance, dg.FloatMetadataValue) or not isinstance(at, dg.FloatMetadataValue):
        return None
    if balance.value is None or at.value is None:
        return None
    return balance.value, datetime.fromtimestamp(at.value, UTC)


spend_assets = [replicate_spend, elevenlabs_spend, anthropic_spend, kie_spend]
