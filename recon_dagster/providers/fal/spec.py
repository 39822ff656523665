"""fal.ai's queue as data: its kinds with their thresholds, its account budget, its settings, its
demo rows, and where its client, parser and sandbox live.

Thresholds follow the design's kinds table (docs/design.md, "Kinds"): a kind's stale threshold is
a few times its provider's usual run time, well past its queue's normal wait, and at most half of
the media lifetime, so a job found stuck still has its media to recover. fal keeps generated media
on its CDN for as long as the request asks (``X-Fal-Object-Lifecycle-Preference``, set at submit
from ``media_url_ttl``): 24 hours here, like KIE's, which also outlasts the reconciler's whole
retry window (``MAX_ATTEMPTS`` x the cadence, ~90 minutes) after the threshold.
"""

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

NAME = "fal"


class FalFamily(StrEnum):
    """One queue API serves every fal model; the family says which files its result holds."""

    IMAGE = "fal-image"  # ``images: [File]``
    VIDEO = "fal-video"  # ``video: File``


# The lifetime asked for each request's media on fal's CDN (seconds at submit).
FAL_MEDIA_TTL = timedelta(hours=24)

SPEC = ProviderSpec(
    name=NAME,
    kinds=(
        # Image models (Flux, SDXL, Recraft...) finish in seconds to a minute once a runner takes
        # them; 10 minutes covers a cold start and a queue backlog several times over.
        async_kind("fal-image", NAME, FalFamily.IMAGE, 10, FAL_MEDIA_TTL, 8, 2.0),
        # Video models (Kling, Veo, Wan, MiniMax...) take 1-10 minutes of generation after their
        # queue wait; 30 minutes, as for Suno and Replicate trainings.
        async_kind("fal-video", NAME, FalFamily.VIDEO, 30, FAL_MEDIA_TTL, 25, 5.0),
    ),
    settings=ProviderSettings(
        title="fal",
        base_url="https://queue.fal.run",
        base_url_env="FAL_BASE_URL",
        key_env="FAL_KEY",
        key_doc="fal API key (`Authorization: Key ...`).",
    ),
    # fal limits concurrent requests per account (by plan); it publishes no request rates, so the
    # rates and the concurrency are our own ceilings.
    reads=Rate(600, 60),
    creates=Rate(60, 60),
    concurrency=48,
    limits_shown="`reads=600/60,creates=60/60,concurrency=48`",
    limits_doc="fal account budget (fal limits concurrent requests per plan; these figures are ours).",
    resource="recon_dagster.providers.fal.client:FalResource",
    parser="recon_dagster.providers.fal.parse:parse_fal",
    sandbox="recon_dagster.providers.fal.sandbox:SANDBOX",
    run_queue=RunQueueLimits(provider_runs=5, batch_runs=3),
    demo=(
        DemoCase("fal Flux image", "fal-image", "image", 20, {"polls_before_done": 0}),
        DemoCase("fal Kling video", "fal-video", "video", 45, {"polls_before_done": 0}),
    ),
)
