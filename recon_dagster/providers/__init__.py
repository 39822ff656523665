"""Provider clients (Dagster resources), the typed poll status, and the pure poll parser."""

from recon_dagster.providers.anthropic import AnthropicResource
from recon_dagster.providers.base import (
    AsyncProviderResource,
    PollBudgetExceeded,
    ProviderConfigError,
    ProviderResource,
)
from recon_dagster.providers.elevenlabs import ElevenLabsResource
from recon_dagster.providers.kie import KieResource
from recon_dagster.providers.parse import parse_poll_response
from recon_dagster.providers.replicate import ReplicateResource
from recon_dagster.providers.resource import ProvidersResource, providers_from_env
from recon_dagster.providers.status import (
    AmbiguousCreateError,
    MediaRef,
    ProviderError,
    ProviderHTTPError,
    ProviderProtocolError,
    UpstreamState,
    UpstreamStatus,
)

__all__ = [
    "AmbiguousCreateError",
    "AnthropicResource",
    "AsyncProviderResource",
    "ElevenLabsResource",
    "KieResource",
    "MediaRef",
    "PollBudgetExceeded",
    "ProviderConfigError",
    "ProviderError",
    "ProviderHTTPError",
    "ProviderProtocolError",
    "ProviderResource",
    "ProvidersResource",
    "ReplicateResource",
    "UpstreamState",
    "UpstreamStatus",
    "parse_poll_response",
    "providers_from_env",
]
