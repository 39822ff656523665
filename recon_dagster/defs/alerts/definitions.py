"""Alerts that reach a person: the ``reconcile_alerts`` sensor over check evaluations and failed
runs, and the incidents it holds open as the ``active_incidents`` asset."""

import dagster as dg

from recon_dagster.defs.alerts.board import active_incidents, none_open
from recon_dagster.defs.alerts.sensor import reconcile_alerts

defs = dg.Definitions(assets=[active_incidents], asset_checks=[none_open], sensors=[reconcile_alerts])
