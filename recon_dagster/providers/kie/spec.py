"""KIE.ai as data: its kinds with their thresholds, its account budget, its settings, its demo rows."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

from recon_dagster.core.kinds import (
    DemoCase,
    ProviderSettings,
    ProviderSpec,
    Rate,
    RunQueueLimits,
    async_kind,
    sync_kind,
)

NAME = "kie"


class KieFamily(StrEnum):
    """KIE's endpoint families: each has its own generate and record-info endpoints and answer shape."""

    MARKET = "kie-market"
    VEO = "kie-veo"
    SUNO = "kie-suno"
    KONTEXT = "kie-kontext"
    LUMA = "kie-luma"
    RUNWAY = "kie-runway"
    LLM = "kie-llm"


# KIE documents 14 days of media retention in general but one endpoint says result URLs
# "typically expire after 24 hours"; the shorter is taken as true.
KIE_MEDIA_TTL = timedelta(hours=24)

SPEC = ProviderSpec(
    name=NAME,
    kinds=(
        async_kind("kie-standard", NAME, KieFamily.MARKET, 10, KIE_MEDIA_TTL, 18, text_result=True),
        async_kind("kie-veo", NAME, KieFamily.VEO, 25, KIE_MEDIA_TTL, 20),
        async_kind("kie-suno", NAME, KieFamily.SUNO, 30, KIE_MEDIA_TTL, 25),
        async_kind("kie-kontext", NAME, KieFamily.KONTEXT, 10, KIE_MEDIA_TTL, 8),
        async_kind("kie-luma", NAME, KieFamily.LUMA, 25, KIE_MEDIA_TTL, 20),
        async_kind("kie-kling3", NAME, KieFamily.MARKET, 25, KIE_MEDIA_TTL, 20),
        async_kind("kie-runway", NAME, KieFamily.RUNWAY, 25, KIE_MEDIA_TTL, 20),
        async_kind("kie-lip-sync", NAME, KieFamily.MARKET, 75, KIE_MEDIA_TTL, 60, 10.0),
        sync_kind("kie-llm", NAME, KieFamily.LLM),
    ),
    settings=ProviderSettings(
        title="KIE",
        base_url="https://api.kie.ai",
        base_url_env="KIE_BASE_URL",
        key_env="KIE_API_KEY",
        key_doc="KIE bearer token.",
        base_url_note=" (the demo and tests point it at the sandbox)",
    ),
    # KIE: about 20 new generation requests per 10 s per account. Reads: not documented; 600/min
    # is our own ceiling.
    reads=Rate(600, 60),
    creates=Rate(20, 10),
    concurrency=48,
    limits_shown="`reads=600/60,creates=20/10,concurrency=48`",
    limits_doc=(
        "KIE account budget: requests per window in seconds for reads (polls) and creates, concurrent "
        "requests; also `kind_share=0.5` (slots one kind may hold while others wait) and `account=NAME` "
        "(accounts with the same name share a budget; default the provider's name). KIE documents ~20 "
        "creates per 10 s; the read figure is our own ceiling."
    ),
    sandbox="recon_dagster.providers.kie.sandbox:SANDBOX",
    resource="recon_dagster.providers.kie.client:KieResource",
    parser="recon_dagster.providers.kie.parse:parse_kie",
    run_queue=RunQueueLimits(provider_runs=5, batch_runs=3),
    demo=(
        DemoCase("THE INCIDENT: 2K image", "kie-standard", "image", 600, {"polls_before_done": 0}, 92, 12),
        DemoCase("Veo video", "kie-veo", "video", 40, {"polls_before_done": 0}),
        DemoCase("Suno song", "kie-suno", "audio", 45, {"polls_before_done": 0}),
        DemoCase(
            "Flux Kontext edit", "kie-kontext", "image", 15, {"outcome": "fail", "polls_before_done": 0}
        ),
        DemoCase(
            "Luma (callback lost)",
            "kie-luma",
            "video",
            30,
            {"polls_before_done": 0, "luma_callback_failed": True},
        ),
        DemoCase("Kling 3.0 video", "kie-kling3", "video", 30, {"outcome": "run_forever"}),
        DemoCase("Runway video", "kie-runway", "video", 30, {"polls_before_done": 0, "expired": True}),
        DemoCase("Lip-sync video", "kie-lip-sync", "video", 80, {"polls_before_done": 0}),
        DemoCase("KIE-proxied LLM", "kie-llm", "text", 6, None),
    ),
)
