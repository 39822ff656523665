"""Provider clients (Dagster resources), the typed poll status, and the pure poll parser.

One package per provider (``providers/<name>/``), listed once in ``providers/registry.py``. The
names below are imported when first used: importing a provider's package (the registry does, for
its spec) must not build ``ProvidersResource``, which is built from the registry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recon_dagster.providers.anthropic import (
        AnthropicResource as AnthropicResource,
    )
    from recon_dagster.providers.base import (
        AsyncProviderResource as AsyncProviderResource,
    )
    from recon_dagster.providers.base import (
        PollBudgetExceeded as PollBudgetExceeded,
    )
    from recon_dagster.providers.base import (
        ProviderConfigError as ProviderConfigError,
    )
    from recon_dagster.providers.base import (
        ProviderResource as ProviderResource,
    )
    from recon_dagster.providers.elevenlabs import (
        ElevenLabsResource as ElevenLabsResource,
    )
    from recon_dagster.providers.kie import (
        KieResource as KieResource,
    )
    from recon_dagster.providers.parse import (
        parse_poll_response as parse_poll_response,
    )
    from recon_dagster.providers.replicate import (
        ReplicateResource as ReplicateResource,
    )
    from recon_dagster.providers.resource import (
        ProvidersResource as ProvidersResource,
    )
    from recon_dagster.providers.resource import (
        providers_from_env as providers_from_env,
    )
    from recon_dagster.providers.status import (
        AmbiguousCreateError as AmbiguousCreateError,
    )
    from recon_dagster.providers.status import (
        MediaRef as MediaRef,
    )
    from recon_dagster.providers.status import (
        ProviderError as ProviderError,
    )
    from recon_dagster.providers.status import (
        ProviderHTTPError as ProviderHTTPError,
    )
    from recon_dagster.providers.status import (
        ProviderProtocolError as ProviderProtocolError,
    )
    from recon_dagster.providers.status import (
        UpstreamState as UpstreamState,
    )
    from recon_dagster.providers.status import (
        UpstreamStatus as UpstreamStatus,
    )

# Where each public name lives (kept for the import paths tests and the worker library use).
_HOMES = {
    "AmbiguousCreateError": "status",
    "AnthropicResource": "anthropic",
    "AsyncProviderResource": "base",
    "ElevenLabsResource": "elevenlabs",
    "KieResource": "kie",
    "MediaRef": "status",
    "PollBudgetExceeded": "base",
    "ProviderConfigError": "base",
    "ProviderError": "status",
    "ProviderHTTPError": "status",
    "ProviderProtocolError": "status",
    "ProviderResource": "base",
    "ProvidersResource": "resource",
    "ReplicateResource": "replicate",
    "UpstreamState": "status",
    "UpstreamStatus": "status",
    "parse_poll_response": "parse",
    "providers_from_env": "resource",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
