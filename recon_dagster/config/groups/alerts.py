"""Where alerts go (the targets are secrets, only named here) and which ones are sent.

A group of ``recon_dagster.config.Settings`` (it inherits this class): see that package."""

from __future__ import annotations

from recon_dagster.config.parse import (
    choice,
    http_url,
    importable_hook,
)
from recon_dagster.config.var import number, secret, setting


class AlertGroup:
    __slots__ = ()

    # fmt: off
    # alerts
    alert_slack_webhook_url = secret(
        "alerts",
        "A Slack incoming webhook (`https://hooks.slack.com/services/...`): one message when an incident "
        "opens, one when it resolves.",
    )
    alert_pagerduty_routing_key = secret(
        "alerts",
        "PagerDuty Events API v2 integration (routing) key: `trigger` when an incident opens, `resolve` when "
        "it turns green, `dedup_key` per check and provider.",
    )
    alert_pagerduty_url = setting(
        "alerts", "URL", "https://events.pagerduty.com/v2/enqueue",
        "PagerDuty Events API v2 endpoint (`https://events.eu.pagerduty.com/v2/enqueue` for an EU account).",
        parse=http_url, bounds="http:// or https://",
    )
    alert_teams_webhook_url = secret(
        "alerts",
        "A Microsoft Teams Workflows webhook (the URL of a \"When a Teams webhook request is received\" "
        "flow): an Adaptive Card when an incident opens and when it resolves.",
    )
    alert_webhook_url = secret(
        "alerts",
        "Any HTTP endpoint: the alert as one JSON object (schema in [operations.md](operations.md#alerts)) "
        "on open and on resolve.",
    )
    alert_webhook_secret = secret(
        "alerts",
        "Signs the generic webhook's body: header `X-Recon-Signature: sha256=<hex HMAC-SHA256 of the body>`.",
    )
    alert_min_severity = setting(
        "alerts", "choice", "error",
        "`error`: alert on failed ERROR checks and failed runs; `warn`: WARN checks too (`no_stuck_jobs`).",
        parse=choice({"error": "error", "warn": "warn", "warning": "warn"}, "error or warn"),
        bounds="`error`, `warn`",
    )
    alert_timeout_s = number(
        10, 1, 120,
        "Timeout of one delivery to one target; a delivery that fails is retried at the sensor's next tick "
        "(at most 10 times).",
        group="alerts",
    )
    alert_hook = setting(
        "alerts", "module:function", None,
        "Your own code, called by the `reconcile_alerts` sensor with each alert (an `Alert`: `action` "
        "trigger or resolve, `key`, `title`, `summary`, `severity`, `provider`, `details`, `links`) next to "
        "the built-in targets, once per incident opened and once when it resolves. Imported and checked "
        "callable when the definitions load and when the CLI starts: a missing module or a non-callable is a "
        "load error naming the variable.",
        parse=importable_hook, bounds="an importable callable", shown_default="—",
    )
    alert_runbook_base_url = setting(
        "alerts", "URL", None,
        "Where this project's `docs/` are served (e.g. `https://github.com/<org>/recon_dagster/blob/main/docs/`): "
        "every alert links its runbook as `<this>operations.md#<section>` next to its first step.",
        parse=http_url, bounds="http:// or https://",
        shown_default="the first step only, no link",
    )
    # fmt: on
