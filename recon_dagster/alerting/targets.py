"""Where alerts go, each in the payload its receiver speaks, over plain httpx.

- **Slack** incoming webhook: ``{"text", "blocks"}`` (header, section, context); Slack answers
  ``200 ok``.
- **PagerDuty** Events API v2: ``trigger`` with ``payload.summary/source/severity`` and a
  ``dedup_key`` per incident (per check, per provider), ``resolve`` with the same key when it turns
  green; PagerDuty answers ``202`` with ``{"status": "success"}``.
- **Microsoft Teams** Workflows ("When a Teams webhook request is received"): a ``message`` whose
  attachment is an Adaptive Card (1.4); the flow answers ``202``.
- **A generic JSON webhook**: ``Alert.as_json()`` with ``version: 1``, signed with
  ``X-Recon-Signature: sha256=<hex HMAC-SHA256 of the body>`` when a secret is set.

Why not dagster-pagerduty / dagster-slack / dagster-msteams: dagster-pagerduty needs ``pypd``
(last released in 2018), and the three only build payloads around one HTTP call each, without the
resolve, the dedup key or the incident model this sensor needs. Four small payload builders and
one ``httpx.Client.post`` each cost less than three more dependencies.

Every text that leaves passes ``redact_secrets`` (provider keys, and these targets' own URLs and
keys, registered when the targets are built); a delivery error names the target and the HTTP
status, never its URL.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from recon_dagster.alerting.incidents import Alert
from recon_dagster.core.redaction import redact_secrets, register_secret, register_url_secret
from recon_dagster.telemetry.instruments import ALERT_DELIVERIES

SOURCE = "recon_dagster"
_SLACK_HEADER_MAX = 150
_SLACK_TEXT_MAX = 2900
_PD_SUMMARY_MAX = 1024
_PD_SEVERITIES = {"critical", "error", "warning", "info"}


def _clean(value: Any) -> Any:
    """``value`` with every string in it redacted (JSON-ready types only)."""
    if isinstance(value, str):
        return redact_secrets(value)
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fact_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


# --- payloads (pure) ------------------------------------------------------------------------------


def slack_payload(alert: Alert) -> dict[str, Any]:
    """A Slack incoming-webhook message: a fallback ``text`` and Block Kit blocks."""
    a = _clean(alert.as_json())
    mark = ":large_green_circle:" if alert.action == "resolve" else ":red_circle:"
    facts = " · ".join(f"*{k}*: {_fact_value(v)}" for k, v in list(a["details"].items())[:8])
    links = " · ".join(f"<{link['href']}|{link['text']}>" for link in a["links"])
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(a["title"], _SLACK_HEADER_MAX)}},
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": _cut(f"{mark} {a['summary']}", _SLACK_TEXT_MAX)},
        },
    ]
    if a["first_step"]:
        runbook = f" (<{a['runbook']}|runbook>)" if a["runbook"] else ""
        blocks.append(
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    "text": _cut(f"*First step:* {a['first_step']}{runbook}", _SLACK_TEXT_MAX),
                },
            }
        )
    context = [part for part in (facts, links, f"`{a['key']}` · {a['at']}") if part]
    blocks.append(
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": _cut(p, _SLACK_TEXT_MAX)} for p in context],
        }
    )
    step = f" First step: {a['first_step']}" if a["first_step"] else ""
    return {"text": _cut(f"{a['title']}: {a['summary']}{step}", _SLACK_TEXT_MAX), "blocks": blocks}


def pagerduty_event(alert: Alert, routing_key: str, client_url: str | None = None) -> dict[str, Any]:
    """An Events API v2 event: ``trigger`` (with its payload) or ``resolve``, deduplicated per incident."""
    a = _clean(alert.as_json())
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": alert.action,
        "dedup_key": pagerduty_dedup_key(alert.key),
    }
    if alert.action == "trigger":
        event["payload"] = {
            "summary": _cut(f"{a['title']}: {a['summary']}", _PD_SUMMARY_MAX),
            "source": a["source"] or SOURCE,
            "severity": alert.severity if alert.severity in _PD_SEVERITIES else "error",
            "component": a["provider"] or _subject(a["key"]),
            "group": SOURCE,
            "class": a["key"].split(":")[0],
            "custom_details": {
                "summary": a["summary"],
                **({"first_step": a["first_step"]} if a["first_step"] else {}),
                **({"runbook": a["runbook"]} if a["runbook"] else {}),
                **a["details"],
            },
        }
        event["client"] = SOURCE
        if client_url:
            event["client_url"] = client_url
        if a["links"]:
            event["links"] = a["links"]
    return event


def _subject(incident_key: str) -> str:
    """What an incident is about: the asset of a check, the job of failing runs."""
    parts = incident_key.split(":")
    return parts[1] if len(parts) > 1 else incident_key


def pagerduty_dedup_key(incident_key: str) -> str:
    """One PagerDuty alert per incident: ``recon_dagster/<incident key>`` (at most 255 characters)."""
    key = f"{SOURCE}/{incident_key}"
    if len(key) <= 255:
        return key
    return f"{SOURCE}/{hashlib.sha256(incident_key.encode()).hexdigest()}"


def teams_payload(alert: Alert) -> dict[str, Any]:
    """A Teams Workflows message carrying one Adaptive Card."""
    a = _clean(alert.as_json())
    resolved = alert.action == "resolve"
    body: list[dict[str, Any]] = [
        {
            "type": "TextBlock",
            "text": a["title"],
            "weight": "Bolder",
            "size": "Medium",
            "wrap": True,
            "color": "Good" if resolved else "Attention",
        },
        {"type": "TextBlock", "text": a["summary"], "wrap": True},
    ]
    facts = [{"title": str(k), "value": _fact_value(v)} for k, v in list(a["details"].items())[:12]]
    facts.append({"title": "incident", "value": a["key"]})
    body.append({"type": "FactSet", "facts": facts})
    if a["first_step"]:
        body.append({"type": "TextBlock", "text": f"**First step:** {a['first_step']}", "wrap": True})
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
    }
    if a["links"]:
        card["actions"] = [
            {"type": "Action.OpenUrl", "title": link["text"], "url": link["href"]} for link in a["links"]
        ]
    return {
        "type": "message",
        "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}
        ],
    }


def webhook_payload(alert: Alert) -> dict[str, Any]:
    return {"version": 1, **_clean(alert.as_json())}


def signature(secret: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of the exact body bytes with the shared secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


# --- delivery ---------------------------------------------------------------------------------------


class DeliveryError(RuntimeError):
    """One target refused or did not answer: the target's name and what happened, never its URL."""


@dataclass(frozen=True)
class Target:
    """One configured receiver: its name, its URL (a secret for all but PagerDuty) and its format."""

    name: str  # slack, pagerduty, teams, webhook
    url: str
    routing_key: str | None = None  # PagerDuty
    secret: str | None = None  # the generic webhook's signing secret
    client_url: str | None = None  # PagerDuty's link back to the Dagster UI

    def __repr__(self) -> str:  # never the URL or a key
        return f"Target({self.name!r})"

    def request(self, alert: Alert) -> tuple[bytes, dict[str, str]]:
        if self.name == "slack":
            payload = slack_payload(alert)
        elif self.name == "pagerduty":
            payload = pagerduty_event(alert, self.routing_key or "", self.client_url)
        elif self.name == "teams":
            payload = teams_payload(alert)
        else:
            payload = webhook_payload(alert)
        body = json.dumps(payload, ensure_ascii=False).encode()
        headers = {"content-type": "application/json", "user-agent": f"{SOURCE}-alerts"}
        if self.secret:
            headers["x-recon-signature"] = signature(self.secret, body)
        return body, headers

    def send(self, client: httpx.Client, alert: Alert, *, timeout_s: float | None = None) -> None:
        """POST ``alert``; ``timeout_s`` overrides the client's (the tick's deadline cuts it)."""
        body, headers = self.request(alert)
        try:
            if timeout_s is None:
                response = client.post(self.url, content=body, headers=headers)
            else:
                response = client.post(self.url, content=body, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise DeliveryError(f"{self.name}: {type(exc).__name__} (no answer)") from None
        if response.status_code >= 300:
            answer = " ".join(response.text.split())[:200]
            raise DeliveryError(redact_secrets(f"{self.name}: HTTP {response.status_code}: {answer}"))


def build_targets(
    *,
    slack_webhook_url: str | None = None,
    pagerduty_routing_key: str | None = None,
    pagerduty_url: str = "https://events.pagerduty.com/v2/enqueue",
    teams_webhook_url: str | None = None,
    webhook_url: str | None = None,
    webhook_secret: str | None = None,
    client_url: str | None = None,
) -> list[Target]:
    """The targets that are configured (blank values are not), each secret registered for masking."""
    for secret in (pagerduty_routing_key, webhook_secret):
        register_secret(secret)
    for url in (slack_webhook_url, teams_webhook_url, webhook_url):
        register_url_secret(url)  # the token in it, not every URL of its host
    targets = []
    if slack_webhook_url:
        targets.append(Target("slack", slack_webhook_url.strip()))
    if pagerduty_routing_key:
        targets.append(
            Target(
                "pagerduty", pagerduty_url, routing_key=pagerduty_routing_key.strip(), client_url=client_url
            )
        )
    if teams_webhook_url:
        targets.append(Target("teams", teams_webhook_url.strip()))
    if webhook_url:
        targets.append(Target("webhook", webhook_url.strip(), secret=(webhook_secret or "").strip() or None))
    return targets


def deliver(client: httpx.Client, alert: Alert, targets: Iterable[Target]) -> dict[str, str]:
    """Send ``alert`` to every target; returns ``{target name: error}`` for those that failed."""
    failed: dict[str, str] = {}
    for target in targets:
        try:
            target.send(client, alert)
        except DeliveryError as exc:
            failed[target.name] = str(exc)
        result = "failed" if target.name in failed else "delivered"
        ALERT_DELIVERIES.add(1, target=target.name, action=alert.action, result=result)
    return failed
