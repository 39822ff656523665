"""Typed Dagster resources: the app database, reconcile settings, and their wiring from the
environment. Provider clients live in ``recon_dagster.providers``; media stores in
``recon_dagster.media.store``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import dagster as dg
import sqlalchemy as sa
from pydantic import Field

from recon_dagster.config import knob
from recon_dagster.core.kinds import MAX_ATTEMPTS, RECONCILE_CADENCE
from recon_dagster.db.engine import get_engine
from recon_dagster.media.download import allowed_hosts_from_env
from recon_dagster.reconcile.finalize import DEFAULT_MAX_MEDIA_BYTES, MediaPolicy
from recon_dagster.reconcile.reconciler import ReconcileSettings


class DatabaseResource(dg.ConfigurableResource):
    """The app's PostgreSQL, where the ``jobs`` rows live.

    The URL is read from ``RECON_DATABASE_URL`` at run time (never put in run config, where the UI
    would show its password); unset means the embedded PostgreSQL.
    """

    def get_engine(self) -> sa.Engine:
        return get_engine()


def _env_number(name: str, fallback: float, cast: type) -> Any:
    """A default from the environment, so run workers the daemon starts see the same settings as
    the process that configured it; a malformed or out-of-bounds value is an error naming the
    variable (bounds: ``recon_dagster.config``)."""
    return knob(name, fallback, cast)


class ReconcileSettingsResource(dg.ConfigurableResource):
    """Knobs of the reconcile controller and the sensor's dispatch.

    Defaults come from ``RECON_MAX_ATTEMPTS``, ``RECON_RECONCILE_CADENCE_S``, ``RECON_LEASE_S``,
    ``RECON_RECONCILE_CONCURRENCY``, ``RECON_BATCH_SIZE``, ``RECON_SINGLE_RUN_BELOW`` and
    ``RECON_SCAN_LIMIT`` when set (read when the code location is imported).
    """

    max_attempts: int = Field(
        default=_env_number("RECON_MAX_ATTEMPTS", MAX_ATTEMPTS, int),
        description="Attempts before force-fail + refund.",
    )
    cadence_seconds: float = Field(
        default=_env_number("RECON_RECONCILE_CADENCE_S", RECONCILE_CADENCE.total_seconds(), float),
        description="Minimum spacing of attempts on one job.",
    )
    lease_seconds: float = Field(
        default=_env_number("RECON_LEASE_S", 900, float), description="Reconcile lease on a dispatched job."
    )
    concurrency: int = Field(
        default=_env_number("RECON_RECONCILE_CONCURRENCY", 16, int),
        description="Jobs worked at once inside one run.",
    )
    batch_size: int = Field(
        default=_env_number("RECON_BATCH_SIZE", 500, int),
        description="Jobs of one kind packed into one run in a backlog.",
    )
    single_run_below: int = Field(
        default=_env_number("RECON_SINGLE_RUN_BELOW", 10, int),
        description="Fewer due jobs of a kind than this: one run per job.",
    )
    scan_limit: int = Field(
        default=_env_number("RECON_SCAN_LIMIT", 5000, int),
        description="Most stale rows dispatched per sensor tick.",
    )
    max_media_bytes: int = Field(default=DEFAULT_MAX_MEDIA_BYTES, description="Download cap per object.")
    media_deadline_seconds: float | None = Field(
        default=None,
        description="All media of one finalize together; None: RECON_MEDIA_DEADLINE_S (600, inside the lease).",
    )

    def settings(self) -> ReconcileSettings:
        return ReconcileSettings(
            max_attempts=self.max_attempts,
            cadence=timedelta(seconds=self.cadence_seconds),
            lease_ttl=timedelta(seconds=self.lease_seconds),
            concurrency=self.concurrency,
        )

    def media_policy(self, headers_for=None) -> MediaPolicy:  # noqa: ANN001
        return MediaPolicy(
            allowed_hosts=allowed_hosts_from_env(),
            max_bytes=self.max_media_bytes,
            headers_for=headers_for,
            deadline_s=self.media_deadline_seconds,
        )


def with_nested_resources_on_top(resources: Mapping[str, Any]) -> dict[str, Any]:
    """``resources`` plus every nested ``ConfigurableResource`` bound at the top level under its
    attribute name (the same object, so one client and one configuration).

    The UI links a nested resource (``providers.kie``) to ``/resources/<attribute>``, and only
    top-level resources have a page there: an unbound nested resource's page fails to load. A
    name already taken by another top-level resource is left alone.
    """
    out = dict(resources)
    pending = list(resources.values())
    while pending:
        parent = pending.pop()
        if not isinstance(parent, dg.ConfigurableResource):
            continue
        for attr, nested in parent.nested_resources.items():
            if isinstance(nested, dg.ConfigurableResource) and attr not in out:
                out[attr] = nested
                pending.append(nested)
    return out
