"""Every alert's runbook: the section of ``docs/operations.md`` that says what to do, and its first
step in one line, so a page at 03:00 starts with an action rather than a search (pure).

``RUNBOOKS`` maps an incident key's pattern to an anchor of ``docs/operations.md`` (each one an
``<a id>`` before its runbook; a test checks every anchor exists) and the first step. The link is
``<RECON_ALERT_RUNBOOK_BASE_URL>operations.md#<anchor>``; without that setting the first step is
still in every payload.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from recon_dagster.alerting.incidents import Alert

DOC = "operations.md"


@dataclass(frozen=True)
class Runbook:
    anchor: str
    first_step: str


# (incident key, or its prefix ending in ":") -> runbook; the longest match wins.
RUNBOOKS: dict[str, Runbook] = {
    "check:provider_health:": Runbook(
        "runbook-provider-health",
        "Read the alert's last reason: a 5xx, 429 or timeout upstream needs nothing (attempts are counted "
        "and retried); a 401/403 is a wrong or expired key: fix the secret and redeploy.",
    ),
    "check:inflight_backlog:no_not_found_burst": Runbook(
        "runbook-not-found-burst",
        "Check the kind's token, account and *_BASE_URL: a burst of not-found is configuration, not lost tasks.",
    ),
    "check:inflight_backlog:no_credit_leak": Runbook(
        "runbook-credit-leak",
        "Run `recon-dagster explain <job>` on a sampled job and settle its reserved usage log by how the job ended.",
    ),
    "check:credit_anomalies:no_new_exhausted_jobs": Runbook(
        "runbook-exhausted",
        "Run `recon-dagster explain <job>` on a few force-failed jobs: a provider down for the whole budget, a "
        "job's own unusable result, or a kind whose stale threshold is too short.",
    ),
    "check:credit_anomalies:no_settle_errors": Runbook(
        "runbook-settle-errors",
        "Read the `reconcile_settle_error` anomaly and fix the data its error names; the settle is retried.",
    ),
    "check:inflight_backlog:no_stuck_jobs": Runbook(
        "runbook-stuck-jobs",
        "Run `recon-dagster status`: it says why each stale job is not due; `retry` one, or `fail --reason` it.",
    ),
    "check:shadow_agreement:": Runbook(
        "runbook-shadow", "Run `recon-dagster plan --shadow-report` and keep that kind in shadow mode."
    ),
    "check:lora_training_cohort:": Runbook(
        "runbook-lora-cohort",
        "Keep the legacy cron until the check passes; its description says what is missing.",
    ),
    "runs:reconcile_job:": Runbook(
        "runbook-reconcile-runs",
        "Open the failed run linked here and read its failure (internal errors, config).",
    ),
    "runs:": Runbook(
        "runbook-job-runs",
        "Open the failed run: usually the app database unreachable or a migration missing (`recon-dagster migrate`).",
    ),
    "check:": Runbook("runbooks", "Open the check's page linked here and read its description and metadata."),
}


def runbook_for(key: str) -> Runbook:
    """The runbook of incident ``key`` (the generic one for a key no entry names)."""
    matches = [k for k in RUNBOOKS if key == k or (k.endswith(":") and key.startswith(k))]
    return RUNBOOKS[max(matches, key=len)] if matches else Runbook("runbooks", RUNBOOKS["check:"].first_step)


def runbook_url(base_url: str | None, runbook: Runbook) -> str | None:
    if not base_url:
        return None
    return f"{base_url if base_url.endswith('/') else base_url + '/'}{DOC}#{runbook.anchor}"


def with_runbook(alert: Alert, base_url: str | None) -> Alert:
    """``alert`` with its runbook's first step and link (idempotent: an alert that has one keeps it)."""
    if alert.first_step:
        return alert
    book = runbook_for(alert.key)
    url = runbook_url(base_url, book)
    links = alert.links + ((("runbook", url),) if url else ())
    return dataclasses.replace(alert, first_step=book.first_step, runbook=url or "", links=links)
