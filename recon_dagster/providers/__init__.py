"""Provider clients (Dagster resources), the typed poll status, and the pure poll parser."""

from recon_dagster.providers.parse import parse_poll_response
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
    "MediaRef",
    "ProviderError",
    "ProviderHTTPError",
    "ProviderProtocolError",
    "UpstreamState",
    "UpstreamStatus",
    "parse_poll_response",
]
