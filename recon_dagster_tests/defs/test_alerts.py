"""Alerts that reach a person, without Dagster+.

The ``reconcile_alerts`` sensor against loopback receivers speaking Slack's incoming webhook,
PagerDuty Events v2, Teams Workflows and a generic JSON webhook: one alert when an incident opens,
one when it resolves, per target, whatever happens in between; real reconcile runs against the
sandbox and PostgreSQL where a real outage is the point.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.defs.alerts.resource import AlertTargetsResource, alert_targets_from_env
from recon_dagster.defs.alerts.sensor import reconcile_alerts
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.alert_receivers import ROUTING_KEY, Receivers, alert_receivers
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick

HEALTH = dg.AssetKey("provider_health")
PATHS = {"slack": "/slack/", "pagerduty": "/pagerduty/", "teams": "/teams/", "webhook": "/hook/"}


@pytest.fixture
def receivers() -> Iterator[Receivers]:
    with alert_receivers(secret="hooksecret0123456789") as r:
        yield r


def _targets(r: Receivers, only: str | None = None) -> AlertTargetsResource:
    fields = {
        "slack": {"slack_webhook_url": r.slack_url},
        "pagerduty": {"pagerduty_routing_key": ROUTING_KEY, "pagerduty_url": r.pagerduty_url},
        "teams": {"teams_webhook_url": r.teams_url},
        "webhook": {"webhook_url": r.webhook_url, "webhook_secret": r.secret},
    }
    chosen: dict[str, Any] = {}
    for name, values in fields.items():
        if only in (None, name):
            chosen.update(values)
    return AlertTargetsResource(**chosen, timeout_s=5, ui_url="http://dagster.example:3000")


class AlertTicks:
    """The sensor evaluated tick after tick, its cursor carried over as the daemon does."""

    def __init__(self, defs: dg.Definitions, instance: dg.DagsterInstance, targets: AlertTargetsResource):
        self.defs, self.instance, self.targets = defs, instance, targets
        self.cursor: str | None = None
        self.messages: list[str] = []

    def __call__(self) -> str:
        with dg.build_sensor_context(
            instance=self.instance,
            repository_def=self.defs.get_repository_def(),
            cursor=self.cursor,
            resources={"alert_targets": self.targets},
            sensor_name="reconcile_alerts",
        ) as ctx:
            result = reconcile_alerts.evaluate_tick(ctx)
        self.cursor = result.cursor
        self.messages.append(result.skip_message or "")
        return result.skip_message or ""

    @property
    def open(self) -> dict[str, Any]:
        return json.loads(self.cursor or "{}").get("open", {})


def _check(
    instance: dg.DagsterInstance, name: str, passed: bool, description: str, asset: dg.AssetKey = HEALTH
) -> None:
    instance.report_runless_asset_event(
        dg.AssetCheckEvaluation(
            asset_key=asset,
            check_name=name,
            passed=passed,
            severity=dg.AssetCheckSeverity.ERROR,
            description=description,
            metadata={"jobs": 8, "jobs_without_answer": 8 if not passed else 0},
        )
    )


def _actions(r: Receivers, target: str) -> list[tuple[str, str]]:
    """(action, incident) of every alert a target accepted, in order."""
    out = []
    for req in r.accepted(PATHS[target]):
        body = req.json
        if target == "pagerduty":
            out.append((body["event_action"], body["dedup_key"].split("/", 1)[1]))
        elif target == "webhook":
            out.append((body["action"], body["key"]))
        elif target == "slack":
            key = body["blocks"][-1]["elements"][-1]["text"].split("`")[1]
            out.append(("resolve" if body["text"].startswith("resolved:") else "trigger", key))
        else:
            card = body["attachments"][0]["content"]
            facts = {f["title"]: f["value"] for f in card["body"][2]["facts"]}
            action = "resolve" if card["body"][0]["text"].startswith("resolved:") else "trigger"
            out.append((action, facts["incident"]))
    return out


@pytest.mark.parametrize("target", sorted(PATHS))
def test_each_target_gets_one_alert_and_one_resolve_per_incident(instance, media_dir, receivers, target):
    ticks = AlertTicks(make_defs(media_dir), instance, _targets(receivers, target))
    ticks()  # the first look: nothing failing yet

    _check(instance, "elevenlabs", False, "elevenlabs DOWN: 8 of 8 job(s) got no answer (100%)")
    ticks()
    _check(instance, "elevenlabs", False, "elevenlabs DOWN: 9 of 9 job(s) got no answer (100%)")
    _check(instance, "kie", False, "kie DOWN: 3 of 4 job(s) got no answer (75%)")
    ticks()
    _check(instance, "elevenlabs", False, "still down")
    ticks()
    _check(instance, "kie", True, "kie healthy: 0 of 4 job(s) got no answer")
    _check(instance, "elevenlabs", True, "elevenlabs healthy: 0 of 9 job(s) got no answer")
    ticks()
    _check(instance, "elevenlabs", True, "elevenlabs healthy")
    ticks()

    per_incident: dict[str, list[str]] = {}
    for action, key in _actions(receivers, target):
        per_incident.setdefault(key, []).append(action)
    assert per_incident == {
        "check:provider_health:elevenlabs": ["trigger", "resolve"],
        "check:provider_health:kie": ["trigger", "resolve"],
    }, ticks.messages
    assert ticks.open == {}
    # Every request the receiver got, it accepted: the payloads are the service's format.
    assert all(r.status < 300 for r in receivers.received), [
        (r.path, r.status, r.body[:300]) for r in receivers.received
    ]


def test_the_pagerduty_events_carry_one_dedup_key_per_check_and_provider_and_a_resolve(
    instance, media_dir, receivers
):
    ticks = AlertTicks(make_defs(media_dir), instance, _targets(receivers, "pagerduty"))
    _check(instance, "replicate", False, "replicate DOWN: 5 of 6 job(s) got no answer (83%)")
    ticks()
    _check(instance, "replicate", True, "replicate healthy")
    ticks()

    trigger, resolve = (r.json for r in receivers.accepted("/pagerduty/"))
    assert trigger["event_action"] == "trigger" and resolve["event_action"] == "resolve"
    assert trigger["dedup_key"] == resolve["dedup_key"] == "recon_dagster/check:provider_health:replicate"
    assert trigger["payload"]["severity"] == "error"
    assert trigger["payload"]["component"] == "replicate"
    assert trigger["payload"]["summary"].startswith(
        "replicate is DOWN (provider_health): replicate DOWN: 5 of 6"
    )
    assert trigger["links"][0]["href"] == "http://dagster.example:3000/assets/provider_health?view=checks"
    assert "payload" not in resolve


def test_a_failing_delivery_is_retried_and_arrives_once(instance, media_dir, receivers):
    ticks = AlertTicks(make_defs(media_dir), instance, _targets(receivers))
    receivers.fail_next("/slack/", 2)
    _check(instance, "kie", False, "kie DOWN")
    first = ticks()
    assert "slack: HTTP 503" in first and receivers.slack_url not in first
    ticks()
    ticks()
    ticks()

    assert _actions(receivers, "slack") == [("trigger", "check:provider_health:kie")]
    for other in ("pagerduty", "teams", "webhook"):  # never re-sent to the targets that took it
        assert _actions(receivers, other) == [("trigger", "check:provider_health:kie")]


def test_the_generic_webhook_is_signed_with_its_secret(instance, media_dir, receivers):
    ticks = AlertTicks(make_defs(media_dir), instance, _targets(receivers, "webhook"))
    _check(instance, "kie", False, "kie DOWN")
    ticks()

    [req] = receivers.accepted("/hook/")
    assert req.headers["x-recon-signature"].startswith("sha256=")
    body = req.json
    assert body["version"] == 1 and body["action"] == "trigger" and body["provider"] == "kie"
    assert body["severity"] == "error" and body["summary"] == "kie DOWN"


def test_warn_checks_alert_only_when_asked(instance, media_dir, receivers, monkeypatch):
    defs = make_defs(media_dir)
    backlog = dg.AssetKey("inflight_backlog")

    def warn(passed: bool) -> None:
        instance.report_runless_asset_event(
            dg.AssetCheckEvaluation(
                asset_key=backlog,
                check_name="no_stuck_jobs",
                passed=passed,
                severity=dg.AssetCheckSeverity.WARN,
            )
        )

    ticks = AlertTicks(defs, instance, _targets(receivers, "webhook"))
    warn(False)
    ticks()
    assert receivers.accepted("/hook/") == []

    monkeypatch.setenv("RECON_ALERT_MIN_SEVERITY", "warn")
    warn(False)
    ticks()
    warn(True)
    ticks()
    assert [(a, k) for a, k in _actions(receivers, "webhook")] == [
        ("trigger", "check:inflight_backlog:no_stuck_jobs"),
        ("resolve", "check:inflight_backlog:no_stuck_jobs"),
    ]
    assert receivers.accepted("/hook/")[0].json["severity"] == "warning"


def _due_again(db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET reconcile_next_at = now() WHERE status IN ('pending', 'processing')")
        )


def test_an_outage_pages_once_names_the_provider_and_resolves_when_it_answers(
    db, instance, media_dir, sandbox, receivers, monkeypatch
):
    """The issue's scenario in small: ElevenLabs jobs whose polls fail, two KIE jobs whose own
    success is text where an image was promised, healthy KIE traffic. One incident (ElevenLabs),
    its failed runs folded into it, nothing for KIE; resolved once ElevenLabs answers again.
    The targets come from the environment (dg.EnvVar), as in production."""
    for name, value in receivers.env().items():
        monkeypatch.setenv(name, value)
    eleven = [
        stale_job_with_task(
            db,
            sandbox,
            "elevenlabs-async",
            Scenario(server_error_first=10, outcome="run_forever"),
            job_type="audio",
        )[1]
        for _ in range(4)
    ]
    for _ in range(2):
        stale_job_with_task(db, sandbox, "kie-standard", Scenario(polls_before_done=0, media_kind="text"))
    for _ in range(3):
        stale_job_with_task(db, sandbox, "kie-standard", Scenario(outcome="run_forever"))
    defs = make_defs(media_dir, cadence_seconds=0, single_run_below=2)
    ticks = AlertTicks(defs, instance, alert_targets_from_env())

    tick(defs, instance)  # every ElevenLabs poll errors (5 tries each: its provider's retries)
    ticks()
    _due_again(db)
    tick(defs, instance)  # still down: more failed runs, the check still red
    ticks()

    opened = [body for body in (r.json for r in receivers.accepted("/hook/"))]
    assert [(b["action"], b["key"]) for b in opened] == [("trigger", "check:provider_health:elevenlabs")], (
        ticks.messages
    )
    assert "elevenlabs DOWN: 4 of 4 job(s) got no answer" in opened[0]["summary"]
    failed_runs = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
    assert failed_runs and {r.tags["recon/provider"] for r in failed_runs} == {"elevenlabs"}
    assert ticks.open.keys() == {"check:provider_health:elevenlabs"}

    # ElevenLabs answers again (each task's errors were its first 10 requests).
    for _ in range(3):
        _due_again(db)
        tick(defs, instance)
        ticks()
        if not ticks.open:
            break
    for target in PATHS:
        assert _actions(receivers, target) == [
            ("trigger", "check:provider_health:elevenlabs"),
            ("resolve", "check:provider_health:elevenlabs"),
        ], (target, ticks.messages)
    assert all(job for job in eleven)


def test_failing_runs_of_other_jobs_page_once_and_resolve_on_a_green_run(db, instance, media_dir, receivers):
    """A run that fails for its own reasons (here the health job, its database gone): the runs
    incident pages once however many runs fail, and resolves with the next run that succeeds."""
    defs = make_defs(media_dir)
    ticks = AlertTicks(defs, instance, _targets(receivers, "webhook"))
    ticks()
    job = defs.resolve_job_def("reconcile_health_job")
    with _database_down():
        for _ in range(2):
            assert not job.execute_in_process(instance=instance, raise_on_error=False).success
            ticks()
    assert _actions(receivers, "webhook") == [("trigger", "runs:reconcile_health_job")], ticks.messages

    assert job.execute_in_process(instance=instance, raise_on_error=False).success
    ticks()
    assert _actions(receivers, "webhook") == [
        ("trigger", "runs:reconcile_health_job"),
        ("resolve", "runs:reconcile_health_job"),
    ], ticks.messages
    body = receivers.accepted("/hook/")[0].json
    assert body["title"] == "reconcile_health_job runs fail"
    assert "Traceback" not in body["summary"] and "\n" not in body["summary"]


@contextmanager
def _database_down() -> Iterator[None]:
    """The app database unreachable for the runs of this process: a port nobody listens on."""
    down = sa.create_engine(
        "postgresql+psycopg://nobody@127.0.0.1:9/none", connect_args={"connect_timeout": 2}
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("recon_dagster.defs.resources.get_engine", lambda: down)
        yield


def test_outage_runs_below_the_health_threshold_fail_but_never_page_on_their_own(
    db, instance, media_dir, sandbox, receivers
):
    """One job whose provider does not answer: its runs are red (an outage for that run), but a
    provider is DOWN only from RECON_HEALTH_MIN_JOBS distinct jobs, and the health check is the one
    provider-outage alert: no page, whatever the number of failed runs."""
    stale_job_with_task(
        db, sandbox, "replicate-prediction", Scenario(server_error_first=1000, outcome="run_forever")
    )
    defs = make_defs(media_dir, cadence_seconds=0)
    ticks = AlertTicks(defs, instance, _targets(receivers, "webhook"))
    ticks()
    for _ in range(2):
        tick(defs, instance)
        ticks()
        _due_again(db)

    failed = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
    assert len(failed) == 2 and all(r.tags["recon/outcome"] == "provider_outage" for r in failed)
    assert receivers.received == [], ticks.messages


def test_a_run_whose_only_job_had_its_own_bad_result_raises_no_alert(
    db, instance, media_dir, sandbox, receivers
):
    stale_job_with_task(db, sandbox, "kie-standard", Scenario(polls_before_done=0, media_kind="text"))
    defs = make_defs(media_dir, cadence_seconds=0)
    ticks = AlertTicks(defs, instance, _targets(receivers))
    for _ in range(3):
        tick(defs, instance)
        ticks()
        _due_again(db)

    assert receivers.received == [], ticks.messages
    assert instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])) == []


def test_no_secret_reaches_a_target_the_cursor_or_the_log(
    db, instance, media_dir, sandbox, receivers, monkeypatch
):
    """A gateway that echoes the provider's key in its error: the alert says the provider is down,
    never the key; the targets' own URLs and secrets are in no payload, cursor or log line."""
    from recon_dagster.sandbox import DEFAULT_API_KEY

    for _ in range(4):
        stale_job_with_task(db, sandbox, "kie-standard", Scenario(echo_key=True, outcome="run_forever"))
    defs = make_defs(media_dir, single_run_below=100)
    ticks = AlertTicks(defs, instance, _targets(receivers))
    tick(defs, instance)
    ticks()

    assert receivers.accepted("/hook/"), ticks.messages
    forbidden = [
        DEFAULT_API_KEY,
        "slacktoken0123456789",
        "teamssig0123456789",
        "hooktoken0123456789",
        "hooksecret0123456789",
    ]
    for req in receivers.received:
        body = req.body.decode()
        assert not [s for s in forbidden if s in body], (req.path, body[:500])
        if not req.path.startswith("/pagerduty/"):
            assert ROUTING_KEY not in body
    for text in [ticks.cursor or "", *ticks.messages]:
        assert not [s for s in [*forbidden, ROUTING_KEY] if s in text], text


def test_the_alert_hook_gets_each_alert_once(instance, media_dir, receivers, monkeypatch):
    got: list[Any] = []
    monkeypatch.setattr("recon_dagster.defs.alerts.sensor._hook", lambda: got.append)
    ticks = AlertTicks(make_defs(media_dir), instance, _targets(receivers, "webhook"))
    _check(instance, "kie", False, "kie DOWN")
    ticks()
    _check(instance, "kie", False, "kie DOWN")
    ticks()
    _check(instance, "kie", True, "kie healthy")
    ticks()

    assert [(a.action, a.key, a.provider) for a in got] == [
        ("trigger", "check:provider_health:kie", "kie"),
        ("resolve", "check:provider_health:kie", "kie"),
    ]


def test_a_down_provider_that_turns_idle_resolves_at_the_next_health_run(db, instance, media_dir, receivers):
    """Its traffic stopped (every job settled or force-failed): the health job's evaluation of
    its check passes, saying it is idle (nothing in flight fails)."""
    defs = make_defs(media_dir)
    ticks = AlertTicks(defs, instance, _targets(receivers, "webhook"))
    _check(instance, "elevenlabs", False, "elevenlabs DOWN: 6 of 6 job(s) got no answer")
    ticks()
    assert defs.resolve_job_def("provider_health_job").execute_in_process(instance=instance).success
    ticks()

    assert _actions(receivers, "webhook") == [
        ("trigger", "check:provider_health:elevenlabs"),
        ("resolve", "check:provider_health:elevenlabs"),
    ], ticks.messages
    resolve = receivers.accepted("/hook/")[1].json
    assert resolve["summary"].startswith("elevenlabs idle: no job of it in flight polled in the last")
