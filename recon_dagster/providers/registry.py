"""The one list of providers. Adding a provider is one package under ``providers/`` and one line here
(CONTRIBUTING.md, "Adding a provider").

Everything else that needs every provider (the resource, the settings and their docs, the account
budgets, the sandbox, the demo, the plan, ``status``, the run-queue limits) derives it from
``PROVIDERS`` through ``recon_dagster.core.kinds`` (``provider_specs()``, ``KINDS``). Only the specs
are imported here (plain data); each provider's resource, parser and sandbox are named in its spec
and imported where they are used.
"""

from __future__ import annotations

from recon_dagster.core.kinds import ProviderSpec
from recon_dagster.providers.anthropic.spec import SPEC as ANTHROPIC
from recon_dagster.providers.elevenlabs.spec import SPEC as ELEVENLABS
from recon_dagster.providers.fal.spec import SPEC as FAL
from recon_dagster.providers.kie.spec import SPEC as KIE
from recon_dagster.providers.replicate.spec import SPEC as REPLICATE

PROVIDERS: tuple[ProviderSpec, ...] = (
    KIE,
    REPLICATE,
    ELEVENLABS,
    ANTHROPIC,
    FAL,
)
