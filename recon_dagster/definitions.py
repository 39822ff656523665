"""The recon_dagster code location: each feature's definitions under ``defs/``, merged here, with
the resources every feature shares wired in one place."""

from typing import Any

import dagster as dg

from recon_dagster.defs.explain.definitions import defs as explain_defs
from recon_dagster.defs.lora.definitions import defs as lora_defs
from recon_dagster.defs.observe.definitions import defs as observe_defs
from recon_dagster.defs.reconcile.definitions import defs as reconcile_defs
from recon_dagster.defs.reconcile.jobs import HANDOFF_IO
from recon_dagster.defs.resources import (
    DatabaseResource,
    ReconcileSettingsResource,
    with_nested_resources_on_top,
)
from recon_dagster.defs.rollout.definitions import defs as rollout_defs
from recon_dagster.defs.settings_check import validate_settings
from recon_dagster.media.store import media_store_from_env
from recon_dagster.providers import providers_from_env

FEATURES = (reconcile_defs, observe_defs, lora_defs, rollout_defs, explain_defs)


def default_resources() -> dict[str, Any]:
    """Resources wired from the environment (docs/configuration.md); secrets via dg.EnvVar."""
    return {
        "database": DatabaseResource(),
        "providers": providers_from_env(),
        "media_store": media_store_from_env(),
        "reconcile_settings": ReconcileSettingsResource.from_config(),
        HANDOFF_IO: dg.mem_io_manager,
    }


def build_defs(resources: dict[str, Any] | None = None) -> dg.Definitions:
    """The definitions with the default resources, some of them replaced (tests, the demo).

    Every ``RECON_*`` setting is checked first: a bad one is a load error naming its variable."""
    validate_settings()
    wired = dg.Definitions(resources=with_nested_resources_on_top({**default_resources(), **(resources or {})}))
    return dg.Definitions.merge(*FEATURES, wired)


defs = build_defs()
