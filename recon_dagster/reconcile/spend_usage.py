"""Spend reconciliation of the providers that bill by usage, not by task: ElevenLabs (characters)
and Anthropic (tokens). Pure, like ``reconcile.spend``.

What our side records (the app's workers write it in ``usage_logs.metadata`` of the job's row):

- ElevenLabs: ``characters`` (what the call was billed, the ``x-character-count`` answer header
  of text-to-speech) and ``request_id`` (its ``request-id`` header, which history lists);
- Anthropic: ``model``, ``input_tokens`` and ``output_tokens`` (the message's ``usage``; cache
  reads and writes count as input), and ``request_id``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from recon_dagster.db.spend import Charge
from recon_dagster.providers.anthropic.spend import UsageBucket
from recon_dagster.providers.elevenlabs.spend import HistoryItem
from recon_dagster.reconcile.spend import Finding, SpendReport, charged_cost


def match_elevenlabs(
    items: Sequence[HistoryItem],
    stats_characters: float | None,
    charges: Sequence[Charge],
    *,
    tolerance_chars: float,
) -> SpendReport:
    """ElevenLabs' characters of the period (its character stats; history's sum when it gives no
    stats) against the characters our jobs recorded. History names the requests: one no charge of
    ours carries (characters nobody charged), one charged for other characters than billed, and a
    charge whose request history does not list (charged without a request)."""
    ours_by_request: dict[str, Charge] = {}
    our_total = 0.0
    for c in charges:
        our_total += c.number("characters") or 0.0
        request = c.metadata.get("request_id")
        if isinstance(request, str) and request:
            ours_by_request[request] = c
    findings: list[Finding] = []
    seen: set[str] = set()
    by_model: dict[str, float] = defaultdict(float)
    for item in sorted(items, key=lambda i: i.item_id):
        by_model[item.model or "unknown"] += item.characters
        charge = ours_by_request.get(item.request_id or "")
        if charge is None:
            detail: dict[str, Any] = {
                "history_item_id": item.item_id,
                "model": item.model,
                "source": item.source,
            }
            findings.append(
                Finding("characters_nobody_charged", item.request_id or item.item_id, item.characters, detail)
            )
            continue
        seen.add(item.request_id or "")
        recorded = charge.number("characters") or 0.0
        if recorded != item.characters:
            detail = {
                "job_id": str(charge.job_id),
                "billed": item.characters,
                "recorded": recorded,
            }
            findings.append(
                Finding("characters_differ", item.request_id or "", item.characters - recorded, detail)
            )
    for request, charge in sorted(ours_by_request.items()):
        if request not in seen:
            detail = {"job_id": str(charge.job_id), "provider_kind": charge.provider_kind}
            findings.append(
                Finding("charged_without_request", request, charge.number("characters") or 0.0, detail)
            )
    history_total = sum(i.characters for i in items)
    provider_total = history_total if stats_characters is None else stats_characters
    return SpendReport(
        provider="elevenlabs",
        unit="characters",
        provider_amount=provider_total,
        our_amount=our_total,
        tolerance=tolerance_chars,
        findings=tuple(findings),
        our_cost_usd=charged_cost(charges),
        breakdown={
            "history_characters": history_total,
            **{f"model/{m}": n for m, n in sorted(by_model.items())},
        },
    )


def match_anthropic(
    buckets: Sequence[UsageBucket] | None,
    charges: Sequence[Charge],
    *,
    final: bool,
    tolerance_tokens: float,
    note: str = "",
) -> SpendReport:
    """Anthropic's tokens of the period per model (its usage report) against the tokens our sync
    calls recorded per model. ``buckets`` None: no admin key, nothing to compare. The report is
    judged only once ``final`` (the usage report's documented delay has passed since the period
    ended); before, a difference is shown, provisional. The difference judged is the largest of
    any one model (a model billed and never recorded, or recorded and never billed)."""
    ours: dict[str, float] = defaultdict(float)
    recorded: dict[str, list[Charge]] = defaultdict(list)
    for c in charges:
        tokens = (c.number("input_tokens") or 0.0) + (c.number("output_tokens") or 0.0)
        model = c.metadata.get("model")
        name = model if isinstance(model, str) and model else "unknown"
        ours[name] += tokens
        recorded[name].append(c)
    if buckets is None:
        return SpendReport(
            provider="anthropic", unit="tokens", provider_amount=0.0, our_amount=sum(ours.values()),
            tolerance=tolerance_tokens, configured=False, note=note or "no admin API key",
            our_cost_usd=charged_cost(charges),
        )  # fmt: skip
    theirs: dict[str, float] = defaultdict(float)
    by_hour: dict[str, float] = defaultdict(float)
    keys: dict[str, set[str]] = defaultdict(set)
    for b in buckets:
        tokens = b.input_tokens + b.output_tokens
        theirs[b.model] += tokens
        by_hour[f"hour/{b.starting_at:%H}"] += tokens
        if b.api_key_id:
            keys[b.model].add(b.api_key_id)
    findings: list[Finding] = []
    worst = 0.0
    for model in sorted(set(theirs) | set(ours)):
        diff = theirs[model] - ours[model]
        if diff == 0:
            continue
        if abs(diff) > abs(worst):
            worst = diff
        detail = {
            "provider_tokens": theirs[model], "our_tokens": ours[model],
            "api_key_ids": sorted(keys[model]),
            "job_ids": [str(c.job_id) for c in recorded[model][:20]],
        }  # fmt: skip
        what = "tokens_nobody_recorded" if diff > 0 else "tokens_not_billed"
        findings.append(Finding(what, model, diff, detail))
    return SpendReport(
        provider="anthropic",
        unit="tokens",
        provider_amount=sum(theirs.values()),
        our_amount=sum(ours.values()),
        tolerance=tolerance_tokens,
        findings=tuple(findings),
        final=final,
        note=note,
        our_cost_usd=charged_cost(charges),
        breakdown={**{f"model/{m}": t for m, t in sorted(theirs.items())}, **dict(sorted(by_hour.items()))},
        judged=worst,
    )


def is_final(period_end: datetime, now: datetime, delay_s: float) -> bool:
    """A period the provider reports with a delay is final ``delay_s`` after it ended."""
    return (now - period_end).total_seconds() >= delay_s


def totals(report: SpendReport) -> Mapping[str, float]:
    """The plotted figures of a report (one series each)."""
    return {
        "provider": report.provider_amount,
        "ours": report.our_amount,
        "difference": report.judged_difference,
        "our_cost_usd": report.our_cost_usd,
    }
