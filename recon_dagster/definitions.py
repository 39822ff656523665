"""The recon_dagster code location: each feature's definitions under ``defs/``, merged here, with
the resources every feature shares wired in one place."""

from typing import Any

import dagster as dg

# The feature modules, not their ``defs``: Dagster's module loader refuses a module that holds more
# than one Definitions object at its top level, so only the merged ``defs`` may live here.
from recon_dagster.defs.explain import definitions as explain
from recon_dagster.defs.lora import definitions as lora
from recon_dagster.defs.observe import definitions as observe
from recon_dagster.defs.reconcile import definitions as reconcile
from recon_dagster.defs.reconcile.jobs import HANDOFF_IO
from recon_dagster.defs.resources import (
    DatabaseResource,
    ReconcileSettingsResource,
    with_nested_resources_on_top,
)
from recon_dagster.defs.rollout import definitions as rollout
from recon_dagster.defs.settings_check import validate_settings
from recon_dagster.media.store import media_store_from_env
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.shadow import modes_from_env

FEATURES = (reconcile.defs, observe.defs, lora.defs, rollout.defs, explain.defs)


def default_resources() -> dict[str, Any]:
    """Resources wired from the environment (docs/configuration.md); secrets via dg.EnvVar."""
    return {
        "database": DatabaseResource(),
        "providers": providers_from_env(),
        "media_store": media_store_from_env(),
        "reconcile_settings": ReconcileSettingsResource(),
        HANDOFF_IO: dg.mem_io_manager,
    }


def build_defs(resources: dict[str, Any] | None = None) -> dg.Definitions:
    """The definitions with the default resources, some of them replaced (tests, the demo).

    Every ``RECON_*`` setting is checked first: a bad one is a load error naming its variable."""
    validate_settings()
    modes_from_env()  # a bad RECON_MODE / RECON_*_KINDS fails the code location at load, in one line
    wired = dg.Definitions(resources=with_nested_resources_on_top({**default_resources(), **(resources or {})}))
    return dg.Definitions.merge(*FEATURES, wired)


defs = build_defs()
