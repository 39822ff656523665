"""The recon_dagster code location: each feature's definitions under ``defs/``, merged here, with
the resources every feature shares wired in one place."""

import sys
from typing import Any

import dagster as dg

from recon_dagster.defs.alerts import definitions as alerts_feature
from recon_dagster.defs.alerts.resource import alert_targets_from_env
from recon_dagster.defs.explain import definitions as explain_feature
from recon_dagster.defs.lora import definitions as lora_feature
from recon_dagster.defs.observe import definitions as observe_feature
from recon_dagster.defs.orphans import definitions as orphans_feature
from recon_dagster.defs.reconcile import definitions as reconcile_feature
from recon_dagster.defs.reconcile.jobs import HANDOFF_IO
from recon_dagster.defs.resources import (
    DatabaseResource,
    ReconcileSettingsResource,
    with_nested_resources_on_top,
)
from recon_dagster.defs.retention import definitions as retention_feature
from recon_dagster.defs.rollout import definitions as rollout_feature
from recon_dagster.defs.settings_check import validate_settings
from recon_dagster.defs.spend import definitions as spend_feature
from recon_dagster.media.store import media_store_from_env
from recon_dagster.providers import providers_from_env
from recon_dagster.providers.anthropic.spend import anthropic_usage_from_env
from recon_dagster.telemetry import setup as telemetry_setup

# Modules, not their Definitions objects: a code location module holds exactly one Definitions at
# its top level (`dg check defs` refuses more), and each feature's module keeps its own.
FEATURES = (
    reconcile_feature,
    observe_feature,
    lora_feature,
    rollout_feature,
    explain_feature,
    alerts_feature,
    orphans_feature,
    spend_feature,
    retention_feature,
)


def default_resources() -> dict[str, Any]:
    """Resources wired from the environment (docs/configuration.md); secrets via dg.EnvVar."""
    return {
        "database": DatabaseResource(),
        "providers": providers_from_env(),
        "media_store": media_store_from_env(),
        "reconcile_settings": ReconcileSettingsResource.from_config(),
        "alert_targets": alert_targets_from_env(),
        "anthropic_usage": anthropic_usage_from_env(),
        HANDOFF_IO: dg.mem_io_manager,
    }


def build_defs(resources: dict[str, Any] | None = None) -> dg.Definitions:
    """The definitions with the default resources, some of them replaced (tests, the demo).

    Every ``RECON_*`` setting is checked first: a bad one is a load error naming its variable."""
    validate_settings()
    # Every Dagster process (code server, run worker) records into the SDK when RECON_TELEMETRY is
    # on; the endpoint and the state gauges start with the first sensor tick (defs/telemetry.py).
    telemetry_setup.start("dagster")
    wired = dg.Definitions(
        resources=with_nested_resources_on_top({**default_resources(), **(resources or {})}),
        # Every job without its own executor (the UI's and a backfill's asset materializations
        # included) runs in one process: the connection budget gives a run worker one share
        # (db/budget.py), and Dagster's default executor would start a process, holding a share
        # of its own, for each step.
        executor=dg.in_process_executor,
    )
    return dg.Definitions.merge(*(feature.defs for feature in FEATURES), wired)


def _load() -> dg.Definitions:
    try:
        return build_defs()
    except Exception as exc:
        # Dagster shows a load error under a long traceback: its one line goes first, on stderr,
        # where the code server's or `dg check defs`'s output starts.
        first = (str(exc).strip().splitlines() or [""])[0]
        print(
            f"recon_dagster: the code location did not load: {type(exc).__name__}: {first}",
            file=sys.stderr,
            flush=True,
        )
        raise


defs = _load()
