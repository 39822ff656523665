"""Replicate: predictions and trainings (both async)."""

from recon_dagster.providers.replicate.client import REPLICATE_BASE_URL, ReplicateResource
from recon_dagster.providers.replicate.spec import SPEC, ReplicateFamily

__all__ = ["REPLICATE_BASE_URL", "SPEC", "ReplicateFamily", "ReplicateResource"]
