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

from recon_dagster.config import Settings, Var, settings
from recon_dagster.db import budget
from recon_dagster.db.engine import DatabaseUnavailable, get_engine, limit_pool
from recon_dagster.db.grants import check_grants
from recon_dagster.media.download import allowed_hosts_from_env
from recon_dagster.reconcile.finalize import DEFAULT_MAX_MEDIA_BYTES, HeadersFor, MediaPolicy, SlotFor
from recon_dagster.reconcile.reconciler import ReconcileSettings


class ConnectionBudgetError(ValueError):
    """The instance's run queue lets more runs start at once than ``RECON_DB_MAX_CONNECTIONS`` has
    connections for (one line saying what to set)."""


def runs_at_once(instance: dg.DagsterInstance) -> int | None:
    """How many runs the instance's run queue lets start at once; None when it sets no limit."""
    from dagster._core.run_coordinator import QueuedRunCoordinator

    coordinator = instance.run_coordinator
    if not isinstance(coordinator, QueuedRunCoordinator):
        return None  # runs are launched as soon as they are requested
    limit = coordinator.get_run_queue_config().max_concurrent_runs
    return None if limit < 0 else limit


class DatabaseResource(dg.ConfigurableResource):  # type: ignore[type-arg]  # bare, as Dagster's own: its parameter is the resource itself
    """The app's PostgreSQL, where the ``jobs`` rows live.

    The URL is read from ``RECON_DATABASE_URL`` at run time (never put in run config, where the UI
    would show its password); without it nothing loads, except where the embedded PostgreSQL was
    asked for. Set up for a run, it gives the run worker its share of the connection budget
    (``RECON_DB_MAX_CONNECTIONS``, ``db/budget.py``) before the run touches the database; set up
    anywhere (a run, a sensor tick) it refuses an instance whose run queue would break the budget.
    """

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        check_runtime_grants()
        instance = context.instance
        if instance is None or instance.is_ephemeral:
            # Built outside any instance, or executing in this process on an ephemeral one (a
            # test's materialize): no daemon launches runs there, so there is no queue to hold to.
            return
        runs = runs_at_once(instance)
        problem = budget.check_run_queue(runs)
        if problem:
            raise ConnectionBudgetError(problem)
        if context.run is not None and runs is not None:  # a run (not a sensor tick)
            limit_pool(budget.run_connections(runs, settings().reconcile_concurrency))

    def get_engine(self) -> sa.Engine:
        return get_engine()


_grants_checked: set[str] = set()


def check_runtime_grants() -> None:
    """Once per process and database: the role in ``RECON_DATABASE_URL`` has every privilege
    recon_dagster needs (``db/grants.py``), or a ``MissingGrant`` line naming the GRANT to run. An
    unreachable database is left to the code that uses it (its own one line, or a skipped tick)."""
    engine = get_engine()
    key = str(engine.url)
    if key in _grants_checked:
        return
    try:
        with engine.connect() as conn:
            check_grants(conn)
    except DatabaseUnavailable:
        return
    _grants_checked.add(key)


def _knob_field(setting: Var[Any]) -> Any:
    # The declared default, not the environment: a class body runs once, at import.
    return Field(default=setting.default, description=f"{setting.doc} Wired from {setting.name}.")


class ReconcileSettingsResource(dg.ConfigurableResource):  # type: ignore[type-arg]  # bare, as Dagster's own: its parameter is the resource itself
    """Knobs of the reconcile controller and the sensor's dispatch.

    ``from_config()`` fills them from ``RECON_MAX_ATTEMPTS``, ``RECON_RECONCILE_CADENCE_S``,
    ``RECON_LEASE_S``, ``RECON_RECONCILE_CONCURRENCY``, ``RECON_BATCH_SIZE``,
    ``RECON_SINGLE_RUN_BELOW`` and ``RECON_SCAN_LIMIT`` (the definitions wire it so, when they are
    built, so run workers the daemon starts see the same settings as the process that configured it).
    """

    max_attempts: int = _knob_field(Settings.max_attempts)
    cadence_seconds: float = _knob_field(Settings.reconcile_cadence_s)
    lease_seconds: float = _knob_field(Settings.lease_s)
    concurrency: int = _knob_field(Settings.reconcile_concurrency)
    batch_size: int = _knob_field(Settings.batch_size)
    single_run_below: int = _knob_field(Settings.single_run_below)
    scan_limit: int = _knob_field(Settings.scan_limit)
    max_media_bytes: int = Field(default=DEFAULT_MAX_MEDIA_BYTES, description="Download cap per object.")
    media_deadline_seconds: float | None = Field(
        default=None,
        description=f"All media of one finalize together; None: {Settings.media_deadline_s.name} "
        f"({Settings.media_deadline_s.default:g}, inside the lease).",
    )

    @classmethod
    def from_config(cls, **overrides: Any) -> ReconcileSettingsResource:
        """The knobs as the environment sets them now (bad values: one-line errors naming them)."""
        now = settings()
        knobs: dict[str, Any] = {
            "max_attempts": now.max_attempts,
            "cadence_seconds": now.reconcile_cadence_s,
            "lease_seconds": now.lease_s,
            "concurrency": now.reconcile_concurrency,
            "batch_size": now.batch_size,
            "single_run_below": now.single_run_below,
            "scan_limit": now.scan_limit,
        }
        return cls(**{**knobs, **overrides})

    def settings(self) -> ReconcileSettings:
        return ReconcileSettings(
            max_attempts=self.max_attempts,
            cadence=timedelta(seconds=self.cadence_seconds),
            lease_ttl=timedelta(seconds=self.lease_seconds),
            concurrency=self.concurrency,
            orphan_look_wait=timedelta(seconds=settings().orphan_look_wait_s),
        )

    def media_policy(
        self, headers_for: HeadersFor | None = None, slot_for: SlotFor | None = None
    ) -> MediaPolicy:
        return MediaPolicy(
            allowed_hosts=allowed_hosts_from_env(),
            max_bytes=self.max_media_bytes,
            headers_for=headers_for,
            slot_for=slot_for,
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
