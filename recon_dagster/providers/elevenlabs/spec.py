"""ElevenLabs as data: its kinds with their thresholds, its account budget, its settings, its demo rows."""

from __future__ import annotations

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

NAME = "elevenlabs"


class ElevenLabsFamily(StrEnum):
    """Dubbing (a task to poll) and text-to-speech (one synchronous call)."""

    DUBBING = "elevenlabs-dubbing"
    TTS = "elevenlabs-tts"


SPEC = ProviderSpec(
    name=NAME,
    kinds=(
        # Finished dubbings are bytes on ElevenLabs' own API, not expiring URLs: no media TTL.
        async_kind("elevenlabs-async", NAME, ElevenLabsFamily.DUBBING, 15, None, 15),
        sync_kind("elevenlabs-sync", NAME, ElevenLabsFamily.TTS),
    ),
    settings=ProviderSettings(
        title="ElevenLabs",
        base_url="https://api.elevenlabs.io",
        base_url_env="ELEVENLABS_BASE_URL",
        key_env="ELEVENLABS_API_KEY",
        key_doc="ElevenLabs `xi-api-key`.",
    ),
    # ElevenLabs limits concurrent requests per plan (5-15 on the lower tiers); rates are ours.
    reads=Rate(600, 60),
    creates=Rate(60, 60),
    concurrency=16,
    limits_shown="`reads=600/60,creates=60/60,concurrency=16`",
    limits_doc="ElevenLabs account budget (it limits concurrency per plan; the rates are ours).",
    sandbox="recon_dagster.providers.elevenlabs.sandbox:SANDBOX",
    resource="recon_dagster.providers.elevenlabs.client:ElevenLabsResource",
    parser="recon_dagster.providers.elevenlabs.parse:parse_elevenlabs",
    run_queue=RunQueueLimits(provider_runs=1),
    demo=(
        DemoCase("ElevenLabs dubbing", "elevenlabs-async", "audio", 20, {"polls_before_done": 0}),
        DemoCase("ElevenLabs TTS", "elevenlabs-sync", "audio", 6, None),
    ),
)
