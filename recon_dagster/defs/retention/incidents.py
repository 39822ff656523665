"""The alert incidents open now, read from the alert sensor's cursor (where the sensor keeps its
``IncidentBook``): while one is open, pruning keeps every row from its start on."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from recon_dagster.defs.alerts.sensor import SENSOR_NAME


def open_incidents_since(instance: dg.DagsterInstance) -> tuple[datetime | None, list[str]]:
    """When the oldest open incident opened (None: none open), and the open incidents' keys."""
    since: float | None = None
    keys: list[str] = []
    for state in instance.all_instigator_state():
        if state.instigator_name != SENSOR_NAME:
            continue
        cursor = getattr(state.instigator_data, "cursor", None)
        if not cursor:
            continue
        try:
            book: dict[str, Any] = json.loads(cursor).get("open") or {}
        except (ValueError, AttributeError):
            continue
        for key, incident in book.items():
            keys.append(key)
            try:
                at = float(incident.get("since"))
            except (TypeError, ValueError):
                at = 0.0  # an incident whose start is unreadable keeps everything
            since = at if since is None else min(since, at)
    return (datetime.fromtimestamp(since, UTC) if since is not None else None), sorted(keys)
