"""A create payload per provider kind, as the host app's workers send them."""

from __future__ import annotations

from typing import Any

from recon_dagster.core.kinds import ASYNC_KINDS

PAYLOADS: dict[str, dict[str, Any]] = {
    "kie-standard": {
        "model": "google/nano-banana",
        "input": {"prompt": "a cat"},
        "sandbox_kind": "kie-standard",
    },
    "kie-kling3": {"model": "kling-3.0/video", "input": {"prompt": "a cat"}, "sandbox_kind": "kie-kling3"},
    "kie-lip-sync": {
        "model": "infinitalk/lip-sync",
        "input": {"prompt": "hi"},
        "sandbox_kind": "kie-lip-sync",
    },
    "kie-veo": {"prompt": "a cat", "model": "veo3_fast"},
    "kie-suno": {"prompt": "a song", "customMode": False, "model": "V4"},
    "kie-kontext": {"prompt": "a cat"},
    "kie-runway": {"prompt": "a cat", "duration": 5},
    "kie-luma": {"prompt": "make it snow", "videoUrl": "https://example.com/in.mp4"},
    "replicate-prediction": {"version": "5c7d5dc6", "input": {"prompt": "a cat"}},
    "replicate-training": {
        "model": "ostris/flux-dev-lora-trainer",
        "version": "e440909d",
        "destination": "me/my-lora",
        "input": {"input_images": "https://example.com/x.zip"},
    },
    "elevenlabs-async": {"source_url": "https://example.com/in.mp4", "target_lang": "es"},
    "fal-image": {"model": "fal-ai/flux/dev", "input": {"prompt": "a cat"}},
    "fal-video": {"model": "fal-ai/kling-video/v2/master/text-to-video", "input": {"prompt": "a cat"}},
}
assert set(PAYLOADS) == set(ASYNC_KINDS)
