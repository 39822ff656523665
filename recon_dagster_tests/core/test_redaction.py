"""No key ever leaves the process: not in errors, job rows, events, anomalies, logs, Dagster's event
log or captured output; in any form (as configured, stripped, URL-encoded, repr-escaped, cut).

End to end: a gateway that answers a poll with ``200 {"code": 401, "msg": "Invalid API key Bearer
<key> ...?api_key=<url-encoded key>"}`` (the sandbox's ``echo_key`` scenario), one
``reconcile --once``, then every place a message can land is searched for the key.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from urllib.parse import quote, quote_plus

import httpx
import pytest
import sqlalchemy as sa
from dagster._serdes import serialize_value

from recon_dagster.core.kinds import KINDS, MAX_ATTEMPTS
from recon_dagster.core.redaction import CUT_PREFIX, MASK, redact_secrets, register_secret
from recon_dagster.providers import KieResource, ProviderError
from recon_dagster.providers.http import HttpSettings, ProviderHttp, generic_error_message
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import make_defs, reconcile_once, usage_status
from recon_dagster_tests.support.redaction import runs

# '+', '/' and '=' make the URL-encoded forms differ from the key itself.
KEY = "sk-live+Echo/Key=" + secrets.token_hex(16)


def leaked_forms(configured: str) -> dict[str, str]:
    """Every spelling of the key a leak could take, by name."""
    key = configured.strip()
    return {
        "configured": configured,
        "stripped": key,
        "url-encoded": quote(key, safe=""),
        "url-encoded (plus)": quote_plus(key),
        "repr-escaped configured": repr(configured)[1:-1],
        "bytes repr": repr(("Bearer " + configured).encode())[2:-1],
        "cut": key[: CUT_PREFIX + 2],
    }


def assert_no_key(texts: dict[str, str], configured: str) -> None:
    hits = [
        f"{form!r} in {where}"
        for where, text in texts.items()
        for form, value in leaked_forms(configured).items()
        if value and value in text
    ]
    assert not hits, f"the key leaked: {hits[:10]} ({len(hits)} hits)"


class _Capture(logging.Handler):
    """Every log record of the process, formatted as a handler would write it (traceback too)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def captured_logs() -> Iterator[_Capture]:
    handler = _Capture()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


@pytest.fixture
def echo_sandbox(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[SandboxServer]:
    """A sandbox that checks the key; polls go through the shared limiter, in the migrated database."""
    with SandboxServer(api_key=KEY) as sb:
        for name, value in sb.env().items():
            monkeypatch.setenv(name, value)
        yield sb


def _all_text(db: sa.Engine) -> dict[str, str]:
    with db.connect() as conn:
        return {
            table: "\n".join(conn.execute(sa.text(f"SELECT row_to_json(t)::text FROM {table} t")).scalars())
            for table in ("jobs", "reconcile_events", "credit_anomalies", "usage_logs")
        }


def _dagster_text(instance) -> dict[str, str]:
    out: dict[str, str] = {}
    for run in instance.get_runs():
        out[f"run {run.run_id}"] = serialize_value(run)
        out[f"event log of {run.run_id}"] = "\n".join(
            serialize_value(entry) for entry in instance.all_logs(run.run_id)
        )
    return out


def _reconcile_echoing_jobs(db, instance, media_dir, sandbox, scenario: Scenario):
    """A counted attempt and a force-fail with its anomaly, both polled from an echoing gateway
    by one ``reconcile --once``; returns the two job rows and the report."""
    kind = "kie-standard"
    jobs = []
    for attempts in (0, MAX_ATTEMPTS - 1):
        user = make_user(db)
        task = sandbox.add_task(kind, scenario)
        job = make_job(
            db,
            user,
            provider_kind=kind,
            provider_task_id=task,
            started_minutes_ago=KINDS[kind].stale_threshold.total_seconds() / 60 + 1,
            reconcile_attempts=attempts,
        )
        reserve(db, job, user, 30)
        jobs.append((job, task))

    report = reconcile_once(make_defs(media_dir), instance=instance)

    # The echo really was answered and really went through every path.
    assert all(sandbox.poll_count(task) >= 1 for _, task in jobs)
    counted, exhausted = (job_row(db, job) for job, _ in jobs)
    assert counted["reconcile_attempts"] == 1 and MASK in counted["reconcile_last_error"]
    assert exhausted["status"] == "failed" and MASK in exhausted["error_message"]
    assert report.summary.errors == 1 and report.summary.failed == 1
    return counted, exhausted, report


def _everywhere(db, instance, capfd, captured_logs) -> dict[str, str]:
    """Every place a message can land: our tables, Dagster's storage, stdout/stderr, log records."""
    out, err = capfd.readouterr()
    return {
        **_all_text(db),
        **_dagster_text(instance),
        "stdout": out,
        "stderr": err,
        "logs": "\n".join(captured_logs.lines),
    }


@pytest.mark.parametrize("configured", [KEY, KEY + "\n", f"  {KEY}\r\n"], ids=["plain", "newline", "padded"])
def test_an_echoed_key_appears_nowhere_after_reconcile_once(
    db, instance, media_dir, echo_sandbox, captured_logs, capfd, monkeypatch, configured
):
    """The gateway refuses the key (401) and echoes it back. A refused key is our configuration,
    not the jobs' fault: no attempt is counted and nothing is refunded, but the refusal is written
    down (the attempt's event, the run's failure line, the logs), and the key is in none of it."""
    monkeypatch.setenv("KIE_API_KEY", configured)
    kind = "kie-standard"
    jobs = []
    for attempts in (0, MAX_ATTEMPTS - 1):
        user = make_user(db)
        task = echo_sandbox.add_task(kind, Scenario(echo_key=True))
        job = make_job(
            db,
            user,
            provider_kind=kind,
            provider_task_id=task,
            started_minutes_ago=KINDS[kind].stale_threshold.total_seconds() / 60 + 1,
            reconcile_attempts=attempts,
        )
        reserve(db, job, user, 30)
        jobs.append((job, task, attempts))

    reconcile_once(make_defs(media_dir), instance=instance)

    assert all(echo_sandbox.poll_count(task) >= 1 for _, task, _ in jobs)
    for job, _, attempts in jobs:
        row = job_row(db, job)
        assert row["status"] == "processing" and row["reconcile_attempts"] == attempts
        assert usage_status(db, job) == "reserved"
    texts = _everywhere(db, instance, capfd, captured_logs)
    assert "401" in texts["reconcile_events"] and MASK in texts["reconcile_events"]
    assert_no_key(texts, configured)


def test_a_key_escaped_in_a_500_body_appears_nowhere_after_reconcile_once(
    db, instance, media_dir, echo_sandbox, captured_logs, capfd
):
    """The gateway answers HTTP 500 with the key as JSON \\u escapes (any case, every character
    or every other one), with \\/ for its '/', and base64'd in a Basic credential."""
    scenario = Scenario(echo_key=True, echo_key_escaped=True)
    counted, _, _ = _reconcile_echoing_jobs(db, instance, media_dir, echo_sandbox, scenario)
    assert "500" in counted["reconcile_last_error"]

    texts = _everywhere(db, instance, capfd, captured_logs)
    assert_no_key(texts, KEY)
    # Nor any run of RUN key characters, read back through any escaping or base64.
    leaked = {where: sorted(runs(KEY, text))[:3] for where, text in texts.items() if runs(KEY, text)}
    assert not leaked, f"the key leaked: {leaked}"


def test_a_key_with_a_newline_is_stripped_when_read_and_the_call_succeeds(echo_sandbox):
    kie = KieResource(base_url=echo_sandbox.api_base_url("kie"), api_key=KEY + "\n")
    task = echo_sandbox.add_task("kie-standard", Scenario(polls_before_done=5))

    status = kie.poll("kie-standard", task)

    assert status.state.value == "running"  # accepted: the header carried the stripped key


def test_a_header_that_cannot_be_sent_never_shows_the_key(echo_sandbox):
    """The layer below the resources: a raw key with a newline, as httpx refuses it."""
    raw = KEY + "\n"
    register_secret(raw)
    http = ProviderHttp(
        provider="kie",
        base_url=echo_sandbox.api_base_url("kie"),
        auth_headers={"Authorization": f"Bearer {raw}"},
        secret=raw,
        settings=HttpSettings(max_attempts=1),
        error_message=lambda r: None,
    )
    with pytest.raises(ProviderError) as caught:
        http.request("GET", "/api/v1/jobs/recordInfo", label="kie-standard", idempotent=True)
    assert_no_key({"error": str(caught.value), "repr": repr(caught.value)}, raw)


@pytest.mark.parametrize("scenario_provider", ["replicate-prediction", "elevenlabs-async"])
def test_other_providers_echoes_are_masked_too(echo_sandbox, scenario_provider):
    from recon_dagster.providers import providers_from_env

    providers = providers_from_env()
    task = echo_sandbox.add_task(scenario_provider, Scenario(echo_key=True))
    with pytest.raises(ProviderError) as caught:
        providers.poll(scenario_provider, task)
    assert_no_key({"error": str(caught.value)}, KEY)
    assert MASK in str(caught.value)


# --- the rule, on text ------------------------------------------------------------------------


def test_every_form_of_a_registered_secret_is_masked_and_other_text_is_kept():
    secret = "tok_" + secrets.token_hex(12) + "/+= \n"
    register_secret(secret)
    for form in leaked_forms(secret).values():
        masked = redact_secrets(f"before {form} after")
        assert masked.startswith("before ") and masked.endswith(" after") and MASK in masked, form
        assert secret.strip()[:CUT_PREFIX] not in masked, form
    assert redact_secrets("nothing secret here") == "nothing secret here"
    # A message cut to a length limit in the middle of the key.
    cut = f"error: Bearer {secret.strip()}"[:30]
    assert secret[:CUT_PREFIX] not in redact_secrets(cut)
    assert redact_secrets(cut).startswith("error: Bearer ")


def test_short_values_are_not_treated_as_secrets():
    register_secret("abc")
    assert redact_secrets("abcabc abc") == "abcabc abc"


def test_log_records_and_tracebacks_are_masked(captured_logs):
    secret = "log_" + secrets.token_hex(12)
    register_secret(secret)
    log = logging.getLogger("recon_dagster.test")
    log.warning("key %s in args", secret)
    try:
        raise RuntimeError(f"boom {quote(secret)}")
    except RuntimeError:
        log.exception("failed with %r", secret + "\n")
    assert_no_key({"logs": "\n".join(captured_logs.lines)}, secret)
    assert any("boom" in line for line in captured_logs.lines)


def test_generic_error_messages_mask_before_they_cut():
    secret = "gen_" + secrets.token_hex(40)
    register_secret(secret)
    body = "x" * 280 + secret
    message = generic_error_message(httpx.Response(500, text=body))
    assert secret[:CUT_PREFIX] not in message


def test_a_webhook_url_masks_its_token_and_never_every_url_of_its_host():
    """A webhook URL carries its credential in a path segment or a query value. Registering the
    URL whole masked every text that began like it: any other URL of that host, a media URL
    included ("from [redacted]747/m/..."), once a test or a deployment configured an alert target."""
    from recon_dagster.core.redaction import register_url_secret

    register_url_secret("http://127.0.0.1:34567/slack/services/T0/B0/slackwebhooktoken0123")
    register_url_secret(
        "https://x.logic.azure.com:443/workflows/5c0f/triggers/manual/paths/invoke?api-version=2016-06-01&sig=teamswebhooksig0123"
    )
    text = (
        "media from http://127.0.0.1:34747/m/0.png; posted to "
        "http://127.0.0.1:34567/slack/services/T0/B0/slackwebhooktoken0123 and "
        "https://x.logic.azure.com:443/workflows/5c0f/triggers/manual/paths/invoke?api-version=2016-06-01&sig=teamswebhooksig0123"
    )
    masked = redact_secrets(text)
    assert "media from http://127.0.0.1:34747/m/0.png;" in masked
    assert "slackwebhooktoken0123" not in masked and "teamswebhooksig0123" not in masked
    assert "api-version=2016-06-01" in masked
