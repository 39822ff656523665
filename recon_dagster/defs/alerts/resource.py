"""``AlertTargetsResource``: where alerts go, wired from the environment through ``dg.EnvVar``.

Webhook URLs and keys are secrets (a Slack or Teams URL is its own credential): they are read
through ``dg.EnvVar`` only, so the UI shows the variable's name, never the value, and they are
registered for masking before anything is sent.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from pydantic import Field

from recon_dagster.alerting.targets import Target, build_targets
from recon_dagster.config import Settings, Var, settings
from recon_dagster.operator.explain import ui_base_url

# Field <- variable, for the secrets (wired as dg.EnvVar when set; Dagster fails on an unset one).
SECRET_FIELDS: dict[str, Var[Any]] = {
    "slack_webhook_url": Settings.alert_slack_webhook_url,
    "pagerduty_routing_key": Settings.alert_pagerduty_routing_key,
    "teams_webhook_url": Settings.alert_teams_webhook_url,
    "webhook_url": Settings.alert_webhook_url,
    "webhook_secret": Settings.alert_webhook_secret,
}


def _secret_field(field: str) -> str | None:
    var = SECRET_FIELDS[field]
    return Field(default=None, repr=False, description=f"{var.doc} Wired from {var.name} (dg.EnvVar).")


class AlertTargetsResource(dg.ConfigurableResource):  # type: ignore[type-arg]  # bare, as Dagster's own: its parameter is the resource itself
    """The built-in alert targets: a Slack incoming webhook, PagerDuty Events v2, a Microsoft Teams
    Workflows webhook and a generic JSON webhook; each one is on when its variable is set."""

    slack_webhook_url: str | None = _secret_field("slack_webhook_url")
    pagerduty_routing_key: str | None = _secret_field("pagerduty_routing_key")
    pagerduty_url: str = Field(
        default=Settings.alert_pagerduty_url.default,
        description=f"PagerDuty Events API v2 endpoint. Wired from {Settings.alert_pagerduty_url.name}.",
    )
    teams_webhook_url: str | None = _secret_field("teams_webhook_url")
    webhook_url: str | None = _secret_field("webhook_url")
    webhook_secret: str | None = _secret_field("webhook_secret")
    timeout_s: float = Field(
        default=Settings.alert_timeout_s.default,
        description=f"Timeout of one delivery. Wired from {Settings.alert_timeout_s.name}.",
    )
    ui_url: str | None = Field(
        default=None,
        description=f"Base URL of the Dagster UI for links in alerts ({Settings.dagster_ui_url.name}).",
    )

    def targets(self) -> list[Target]:
        return build_targets(
            slack_webhook_url=self.slack_webhook_url,
            pagerduty_routing_key=self.pagerduty_routing_key,
            pagerduty_url=self.pagerduty_url,
            teams_webhook_url=self.teams_webhook_url,
            webhook_url=self.webhook_url,
            webhook_secret=self.webhook_secret,
            client_url=self.ui_url,
        )


def alert_targets_from_env() -> AlertTargetsResource:
    """The production wiring: every secret through ``dg.EnvVar`` (only those set), the rest from
    their settings."""
    now = settings()
    secrets = {field: dg.EnvVar(var.name) for field, var in SECRET_FIELDS.items() if now.is_set(var)}
    return AlertTargetsResource(
        **secrets,  # an EnvVar stands for its value until the resource is built
        pagerduty_url=now.alert_pagerduty_url,
        timeout_s=now.alert_timeout_s,
        ui_url=ui_base_url(default=None),
    )
