"""Alerts that reach a person: the ``reconcile_alerts`` sensor over check evaluations and failed runs."""

import dagster as dg

from recon_dagster.defs.alerts.sensor import reconcile_alerts

defs = dg.Definitions(sensors=[reconcile_alerts])
