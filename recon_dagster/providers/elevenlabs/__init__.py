"""ElevenLabs: dubbing (async) and text-to-speech (sync)."""

from recon_dagster.providers.elevenlabs.client import ELEVENLABS_BASE_URL, ElevenLabsResource
from recon_dagster.providers.elevenlabs.spec import SPEC, ElevenLabsFamily

__all__ = ["ELEVENLABS_BASE_URL", "SPEC", "ElevenLabsFamily", "ElevenLabsResource"]
