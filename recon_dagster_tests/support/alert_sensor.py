"""The ``reconcile_alerts`` sensor ticked in-process as the daemon ticks it (its cursor carried
over), and what each loopback receiver accepted as (action, incident) pairs."""

from __future__ import annotations

import json
import logging
from typing import Any

import dagster as dg

from recon_dagster.defs.alerts.resource import AlertTargetsResource
from recon_dagster.defs.alerts.sensor import reconcile_alerts
from recon_dagster_tests.support.alert_receivers import Receivers


class SensorTicks:
    """The sensor evaluated tick after tick, its cursor carried over as the daemon does."""

    def __init__(self, defs: dg.Definitions, instance: dg.DagsterInstance, targets: AlertTargetsResource):
        self.defs, self.instance, self.targets = defs, instance, targets
        self.repository = defs.get_repository_def()
        self.cursor: str | None = None
        self.messages: list[str] = []
        self.log: list[tuple[str, str]] = []  # (level, line) the sensor logged

    def _collect(self) -> logging.Handler:
        ticks = self

        class Collect(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                ticks.log.append((record.levelname, record.getMessage()))

        return Collect()

    def __call__(self) -> str:
        with dg.build_sensor_context(
            instance=self.instance,
            repository_def=self.repository,
            cursor=self.cursor,
            resources={"alert_targets": self.targets},
            sensor_name="reconcile_alerts",
        ) as ctx:
            ctx.log.addHandler(self._collect())
            result = reconcile_alerts.evaluate_tick(ctx)
        self.cursor = result.cursor
        self.messages.append(result.skip_message or "")
        return result.skip_message or ""

    @property
    def open(self) -> dict[str, Any]:
        return dict(json.loads(self.cursor or "{}").get("open", {}))


def webhook_actions(r: Receivers, prefix: str = "/hook/") -> list[tuple[str, str]]:
    """(action, incident) of every alert the generic webhook under ``prefix`` accepted, in order."""
    return [(req.json["action"], req.json["key"]) for req in r.accepted(prefix)]


def per_incident(actions: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for action, key in actions:
        out.setdefault(key, []).append(action)
    return out
