"""Anthropic Messages API (sync only: nothing to poll)."""

from recon_dagster.providers.anthropic.client import ANTHROPIC_BASE_URL, AnthropicResource
from recon_dagster.providers.anthropic.spec import SPEC

__all__ = ["ANTHROPIC_BASE_URL", "SPEC", "AnthropicResource"]
