"""fal.ai: the queue API, for every fal model (image and video kinds)."""

from recon_dagster.providers.fal.client import FAL_BASE_URL, FalResource
from recon_dagster.providers.fal.spec import SPEC, FalFamily

__all__ = ["FAL_BASE_URL", "SPEC", "FalFamily", "FalResource"]
