"""KIE.ai: market jobs, Veo, Suno, Flux Kontext, Runway, Luma (async) and the LLM proxy (sync)."""

from recon_dagster.providers.kie.client import KIE_BASE_URL, KieResource
from recon_dagster.providers.kie.spec import SPEC, KieFamily

__all__ = ["KIE_BASE_URL", "SPEC", "KieFamily", "KieResource"]
