"""Typed Dagster resources: the app database, reconcile settings, and their wiring from the
environment. Provider clients live in ``recon_dagster.providers``; media stores in
``recon_dagster.media.store``."""

from __future__ import annotations

from datetime import timedelta

import dagster as dg
import sqlalchemy as sa
from pydantic import Field

from recon_dagster.db.engine import get_engine
from recon_dagster.kinds import MAX_ATTEMPTS, RECONCILE_CADENCE
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


class ReconcileSettingsResource(dg.ConfigurableResource):
    """Knobs of the reconcile controller and the sensor's dispatch."""

    max_attempts: int = Field(default=MAX_ATTEMPTS, description="Attempts before force-fail + refund.")
    cadence_seconds: float = Field(
        default=RECONCILE_CADENCE.total_seconds(), description="Minimum spacing of attempts on one job."
    )
    lease_seconds: float = Field(default=900, description="Reconcile lease on a dispatched job.")
    concurrency: int = Field(default=16, description="Jobs worked at once inside one run.")
    batch_size: int = Field(default=200, description="Jobs of one kind packed into one run in a backlog.")
    single_run_below: int = Field(
        default=10, description="Fewer due jobs of a kind than this: one run per job."
    )
    scan_limit: int = Field(default=5000, description="Most stale rows dispatched per sensor tick.")
    max_media_bytes: int = Field(default=DEFAULT_MAX_MEDIA_BYTES, description="Download cap per object.")

    def settings(self) -> ReconcileSettings:
        return ReconcileSettings(
            max_attempts=self.max_attempts,
            cadence=timedelta(seconds=self.cadence_seconds),
            lease_ttl=timedelta(seconds=self.lease_seconds),
            concurrency=self.concurrency,
        )

    def media_policy(self, headers_for=None) -> MediaPolicy:  # noqa: ANN001
        return MediaPolicy(
            allowed_hosts=allowed_hosts_from_env(), max_bytes=self.max_media_bytes, headers_for=headers_for
        )
