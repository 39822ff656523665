"""Provider clients (Dagster resources), the typed poll status, and the pure poll parser."""

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
]
