"""``AlertTargetsResource``: where alerts go, wired from the environment through ``dg.EnvVar``.

Webhook URLs and keys are secrets (a Slack or Teams URL is its own credential): they are read
through ``dg.EnvVar`` only, so the UI shows the variable's name, never the value, and they are
registered for masking before anything is sent.
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from recon_dagster import config
from recon_dagster.alerting.targets import Target, build_targets
from recon_dagster.operator.explain import ui_base_url

# Field <- variable, for the secrets (wired as dg.EnvVar when set; Dagster fails on an unset one).
SECRET_FIELDS = {
    "slack_webhook_url": "RECON_ALERT_SLACK_WEBHOOK_URL",
    "pagerduty_routing_key": "RECON_ALERT_PAGERDUTY_ROUTING_KEY",
    "teams_webhook_url": "RECON_ALERT_TEAMS_WEBHOOK_URL",
    "webhook_url": "RECON_ALERT_WEBHOOK_URL",
    "webhook_secret": "RECON_ALERT_WEBHOOK_SECRET",
}


def _secret_field(name: str) -> str | None:
    return Field(default=None, repr=False, description=f"{config.SETTINGS[name].doc} Wired from {name} (dg.EnvVar).")


class AlertTargetsResource(dg.ConfigurableResource):  # type: ignore[type-arg]  # bare, as Dagster's own: its parameter is the resource itself
    """The built-in alert targets: a Slack incoming webhook, PagerDuty Events v2, a Microsoft Teams
    Workflows webhook and a generic JSON webhook; each one is on when its variable is set."""

    slack_webhook_url: str | None = _secret_field("RECON_ALERT_SLACK_WEBHOOK_URL")
    pagerduty_routing_key: str | None = _secret_field("RECON_ALERT_PAGERDUTY_ROUTING_KEY")
    pagerduty_url: str = Field(
        default=config.SETTINGS["RECON_ALERT_PAGERDUTY_URL"].default,
        description="PagerDuty Events API v2 endpoint. Wired from RECON_ALERT_PAGERDUTY_URL.",
    )
    teams_webhook_url: str | None = _secret_field("RECON_ALERT_TEAMS_WEBHOOK_URL")
    webhook_url: str | None = _secret_field("RECON_ALERT_WEBHOOK_URL")
    webhook_secret: str | None = _secret_field("RECON_ALERT_WEBHOOK_SECRET")
    timeout_s: float = Field(default=10.0, description="Timeout of one delivery. Wired from RECON_ALERT_TIMEOUT_S.")
    ui_url: str | None = Field(
        default=None, description="Base URL of the Dagster UI for links in alerts (RECON_DAGSTER_UI_URL)."
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
    secrets = {field: dg.EnvVar(name) for field, name in SECRET_FIELDS.items() if config.is_set(name)}
    return AlertTargetsResource(
        **secrets,  # an EnvVar stands for its value until the resource is built
        pagerduty_url=config.get("RECON_ALERT_PAGERDUTY_URL"),
        timeout_s=config.get("RECON_ALERT_TIMEOUT_S"),
        ui_url=ui_base_url(default=None),
    )
