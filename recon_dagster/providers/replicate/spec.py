"""Replicate as data: its kinds with their thresholds, its account budget, its settings, its demo rows."""

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
)

NAME = "replicate"


class ReplicateFamily(StrEnum):
    """Replicate's two collections, each with its own create and get endpoints."""

    PREDICTION = "replicate-prediction"
    TRAINING = "replicate-training"


# Replicate deletes API-created outputs one hour after completion.
REPLICATE_MEDIA_TTL = timedelta(hours=1)

SPEC = ProviderSpec(
    name=NAME,
    kinds=(
        async_kind(
            "replicate-prediction",
            NAME,
            ReplicateFamily.PREDICTION,
            20,
            REPLICATE_MEDIA_TTL,
            15,
            2.0,
            text_result=True,
        ),
        async_kind("replicate-training", NAME, ReplicateFamily.TRAINING, 30, REPLICATE_MEDIA_TTL, 60, 10.0),
    ),  # fmt: skip
    settings=ProviderSettings(
        title="Replicate",
        base_url="https://api.replicate.com/v1",
        base_url_env="REPLICATE_BASE_URL",
        key_env="REPLICATE_API_TOKEN",
        key_doc="Replicate bearer token.",
    ),
    # Replicate: create 600/min, every other call 3000/min.
    reads=Rate(3000, 60),
    creates=Rate(600, 60),
    concurrency=64,
    limits_shown="`reads=3000/60,creates=600/60,concurrency=64`",
    limits_doc="Replicate account budget (documented: create 600/min, other calls 3000/min).",
    sandbox="recon_dagster.providers.replicate.sandbox:SANDBOX",
    resource="recon_dagster.providers.replicate.client:ReplicateResource",
    parser="recon_dagster.providers.replicate.parse:parse_replicate",
    run_queue=RunQueueLimits(provider_runs=6, batch_runs=4),
    demo=(
        DemoCase("Replicate prediction", "replicate-prediction", "image", 25, {"polls_before_done": 0}),
        DemoCase(
            "Replicate LoRA training", "replicate-training", "lora-training", 35, {"polls_before_done": 0}
        ),
    ),
)
