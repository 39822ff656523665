"""Every alert carries its runbook: the first step in one line and a link to its section of
``docs/operations.md`` (``RECON_ALERT_RUNBOOK_BASE_URL``), in the Slack, PagerDuty and Teams
payloads; every anchor a runbook names exists in the page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from recon_dagster.alerting.incidents import Alert, IncidentBook, Signal
from recon_dagster.alerting.runbook import RUNBOOKS, runbook_for, with_runbook
from recon_dagster.alerting.targets import pagerduty_event, slack_payload, teams_payload

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
BASE = "https://docs.example/recon/docs/"
KEYS = [
    "check:provider_health:replicate",
    "check:credit_anomalies:no_new_exhausted_jobs",
    "check:inflight_backlog:no_stuck_jobs",
    "check:inflight_backlog:no_credit_leak",
    "runs:reconcile_job:fal",
    "runs:provider_health_job",
    "check:replicate_spend:replicate_spend_matches",
]


def test_every_runbook_anchor_is_in_operations_md():
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', OPERATIONS.read_text()))
    anchors |= {"runbooks"}  # the section's own heading
    assert {b.anchor for b in RUNBOOKS.values()} <= anchors


@pytest.mark.parametrize("key", KEYS)
def test_each_payload_carries_the_first_step_and_the_runbook_link(key):
    alert = with_runbook(Alert("trigger", key, "something is wrong", "4 jobs got no answer"), BASE)
    book = runbook_for(key)
    url = f"{BASE}operations.md#{book.anchor}"

    slack = json.dumps(slack_payload(alert))
    assert book.first_step[:60] in slack and url in slack
    pd = pagerduty_event(alert, "routing-key")
    assert pd["payload"]["custom_details"]["first_step"] == book.first_step
    assert {"text": "runbook", "href": url} in pd["links"]
    teams = json.dumps(teams_payload(alert))
    assert book.first_step[:60] in teams and url in teams


def test_without_a_base_url_the_first_step_is_still_there():
    alert = with_runbook(Alert("trigger", "check:provider_health:fal", "t", "s"), None)
    assert alert.first_step and alert.runbook == "" and alert.links == ()
    assert alert.first_step in slack_payload(alert)["text"]


def test_a_resolve_says_what_is_still_wrong():
    book = IncidentBook()
    book.observe(
        Signal("check:provider_health:replicate", True, "replicate is DOWN", "replicate DOWN: 6 of 6", 0)
    )
    still = "replicate DEGRADED: 4 of 15 job(s) got no answer (27%) in the last 30 min"
    [resolve] = book.observe(Signal("check:provider_health:replicate", False, "replicate", still, 600))
    resolve = with_runbook(resolve, BASE)
    assert resolve.action == "resolve" and still in resolve.summary
    assert still in json.dumps(slack_payload(resolve))
