"""Watching the providers' accounts: provider health and the daily spend reconciliation.

A group of ``recon_dagster.config.Settings`` (it inherits this class): see that package."""

from __future__ import annotations

from recon_dagster.config.var import DAY_S, WEEK_S, number, whole


class AccountGroup:
    __slots__ = ()

    # fmt: off
    # provider health
    health_window_s = number(
        1800, 60, DAY_S,
        "Provider health looks back this many seconds: each job's latest poll in the window counts once, "
        "answered or not (`provider_health`, `reconcile_error_rates`).",
        group="provider health",
    )
    health_min_jobs = whole(
        3, 1, 100_000,
        "A provider is DOWN only when at least this many distinct jobs got no answer in the window (one "
        "job's repeated failures never make an outage).",
        group="provider health",
    )
    health_down_share = number(
        0.5, 0, 0.999, "...and they are more than this share of the jobs it was asked about in the window.",
        group="provider health",
    )
    health_degraded_min_jobs = whole(
        2, 1, 100_000,
        "A provider that is not DOWN is DEGRADED when at least this many of its jobs got no answer at their "
        "latest poll in the window (`provider_health`'s check fails at WARN severity)...",
        group="provider health",
    )
    health_degraded_share = number(
        0.2, 0, 0.999, "...and they are at least this share of its jobs polled in the window.",
        group="provider health",
    )
    health_slow_poll_s = number(
        10, 0.1, 3600,
        "A provider whose answered polls in the window take this long or longer (90th percentile) is shown "
        "slow in `provider_health` (never DOWN: it answers).",
        group="provider health",
    )
    # spend reconciliation
    spend_replicate_tolerance_s = number(
        0, 0, DAY_S,
        "Replicate compute seconds of a day billed for tasks nobody was charged for (unknown, orphaned or "
        "refunded tasks) that `replicate_spend`'s check lets pass; a job charged whose task Replicate never "
        "listed fails it whatever this says.",
        group="spend reconciliation",
    )
    spend_elevenlabs_tolerance_chars = whole(
        0, 0, 1_000_000_000,
        "Characters by which ElevenLabs' count of a day (its character stats) may differ from the characters "
        "our jobs recorded (`usage_logs.metadata.characters`) before `elevenlabs_spend`'s check fails.",
        group="spend reconciliation",
    )
    spend_anthropic_tolerance_tokens = whole(
        0, 0, 1_000_000_000_000,
        "Tokens by which Anthropic's usage report of a day may differ, for any one model, from the tokens "
        "our sync calls recorded (`usage_logs.metadata.input_tokens` + `output_tokens`) before "
        "`anthropic_spend`'s check fails.",
        group="spend reconciliation",
    )
    spend_anthropic_final_after_s = number(
        DAY_S, 0, WEEK_S,
        "Seconds after a day (or an hour) ends before Anthropic's usage report of it is final (Anthropic exports usage "
        "in batches, usually within hours, at worst a day later); before, a difference is shown as "
        "provisional and the check stays green.",
        group="spend reconciliation",
    )
    spend_kie_tolerance_credits = number(
        0, 0, 1_000_000_000,
        "KIE credits by which the account balance's change between two samples may differ from the "
        "credits our KIE jobs of that window recorded (`usage_logs.metadata.provider_credits`) before "
        "`kie_spend`'s check fails.",
        group="spend reconciliation",
    )
    # fmt: on
