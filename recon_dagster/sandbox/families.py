"""The endpoint families the sandbox's built-in provider routes answer for (the values of the
providers' own ``*Family`` enums, which the sandbox may not import: it is a sibling layer).

A provider whose sandbox lives in its own package (``ProviderSpec.sandbox``) brings its families
with it (``sandbox/plugins.py``).
"""

from __future__ import annotations

from enum import StrEnum


class Family(StrEnum):
    KIE_MARKET = "kie-market"
    KIE_VEO = "kie-veo"
    KIE_SUNO = "kie-suno"
    KIE_KONTEXT = "kie-kontext"
    KIE_LUMA = "kie-luma"
    KIE_RUNWAY = "kie-runway"
    KIE_LLM = "kie-llm"
    REPLICATE_PREDICTION = "replicate-prediction"
    REPLICATE_TRAINING = "replicate-training"
    ELEVENLABS_DUBBING = "elevenlabs-dubbing"
    ELEVENLABS_TTS = "elevenlabs-tts"
    ANTHROPIC = "anthropic"
