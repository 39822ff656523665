"""Anthropic as data: its one synchronous kind, its account budget, its settings, its demo row."""

from __future__ import annotations

from recon_dagster.core.kinds import DemoCase, ProviderSettings, ProviderSpec, Rate, RunQueueLimits, sync_kind

NAME = "anthropic"
# The Messages API has one shape; its kind's family is the provider itself.
MESSAGES = "anthropic"

SPEC = ProviderSpec(
    name=NAME,
    kinds=(sync_kind("anthropic-sync", NAME, MESSAGES),),
    settings=ProviderSettings(
        title="Anthropic",
        base_url="https://api.anthropic.com",
        base_url_env="ANTHROPIC_BASE_URL",
        key_env="ANTHROPIC_API_KEY",
        key_doc="Anthropic key.",
        extra_secrets=(
            (
                "ANTHROPIC_ADMIN_API_KEY",
                "Anthropic Admin API key (`sk-ant-admin...`), optional: `anthropic_spend` reads the "
                'organization\'s usage report with it; unset, the asset reports "not configured" and '
                "its check stays green.",
                "providers/anthropic/spend.py",
            ),
        ),
    ),
    # Anthropic: requests per minute per tier (50 on tier 1); calls are billed creates.
    reads=None,
    creates=Rate(50, 60),
    concurrency=16,
    limits_shown="`reads=none,creates=50/60,concurrency=16`",
    limits_doc="Anthropic account budget (requests per minute per tier; every call is a billed create).",
    sandbox="recon_dagster.providers.anthropic.sandbox:SANDBOX",
    resource="recon_dagster.providers.anthropic.client:AnthropicResource",
    run_queue=RunQueueLimits(provider_runs=1),
    demo=(DemoCase("Anthropic ai-writer", "anthropic-sync", "text", 6, None),),
)
