"""Alerts without Dagster+: incidents opened and resolved once each, delivered to Slack, PagerDuty,
Microsoft Teams and any JSON webhook over plain httpx (no Dagster here; the sensor that reads
check evaluations and runs is ``recon_dagster.defs.alerts``)."""
