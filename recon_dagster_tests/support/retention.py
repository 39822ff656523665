"""Retention tests' helpers: runs and an alert sensor cursor put straight into a real instance."""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

import dagster as dg


def add_run(
    instance: dg.DagsterInstance,
    job_name: str,
    status: dg.DagsterRunStatus,
    tags: dict[str, str] | None = None,
) -> str:
    """A finished (or not) run of ``job_name`` in the instance's run storage, with one event."""
    run_id = str(uuid.uuid4())
    instance.add_run(dg.DagsterRun(job_name=job_name, run_id=run_id, status=status, tags=tags or {}))
    instance.report_engine_event("seeded", instance.get_run_by_id(run_id))
    return run_id


def set_alert_cursor(instance: dg.DagsterInstance, state: dict[str, Any]) -> None:
    """The alert sensor's cursor as the daemon stores it (its instigator state)."""
    from dagster._core.remote_origin import (
        InProcessCodeLocationOrigin,
        RemoteInstigatorOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.scheduler.instigation import (
        InstigatorState,
        InstigatorStatus,
        InstigatorType,
        SensorInstigatorData,
    )
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    from recon_dagster.defs.alerts.sensor import SENSOR_NAME

    location = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(executable_path=sys.executable, module_name="recon_dagster.definitions"),
        location_name="recon_dagster",
    )
    origin = RemoteInstigatorOrigin(RemoteRepositoryOrigin(location, "__repository__"), SENSOR_NAME)
    new = InstigatorState(
        origin,
        InstigatorType.SENSOR,
        InstigatorStatus.RUNNING,
        SensorInstigatorData(cursor=json.dumps(state)),
    )
    if instance.get_instigator_state(new.instigator_origin_id, new.selector_id) is None:
        instance.add_instigator_state(new)
    else:
        instance.update_instigator_state(new)
