"""``reconcile_alerts``: alerts that reach a person, without Dagster+.

Dagster OSS alerts on nothing by itself: a run-failure sensor never sees a check that fails
without failing its run, and alert policies are a Dagster+ feature. This sensor reads, each tick,
every asset check evaluation and every failed run since its cursor (``signals``), turns them into
incidents (``recon_dagster.alerting.incidents``: one alert when one opens, one when it resolves,
nothing in between), and delivers each alert to the targets that are configured (Slack,
PagerDuty, Microsoft Teams, a JSON webhook; ``AlertTargetsResource``) and to ``RECON_ALERT_HOOK``.

Its cursor (JSON) holds the last check record id per check, the last failed-run storage id, the
open incidents and the deliveries still owed to a target that failed (retried each tick; a target
is given up on after ``MAX_TRIES`` failed tries, ``recon_dagster.alerting.delivery``). Deliveries
end ``DELIVERY_BUDGET_S`` after the tick began, so a target that never answers cannot make the
tick outlive Dagster's sensor timeout (the daemon would keep the old cursor and every target
would get every alert again), and what the ``active_incidents`` asset last showed (``shown``: the
sensor writes that asset when it changes, ``board``). It holds no secret. With no target configured, it still logs each alert at
ERROR (trigger) or INFO (resolve), so the sensor's tick history is the alert log.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import dagster as dg
import httpx

from recon_dagster.alerting.delivery import Owed, deliver_within
from recon_dagster.alerting.incidents import Alert, IncidentBook, Signal
from recon_dagster.alerting.runbook import with_runbook
from recon_dagster.alerting.targets import Target
from recon_dagster.config import PREFIX, Settings, settings
from recon_dagster.core.redaction import redact_secrets
from recon_dagster.core.tls import shared_tls_context
from recon_dagster.defs.alerts.board import OPEN_INCIDENTS, SENSOR, board_events
from recon_dagster.defs.alerts.resource import AlertTargetsResource
from recon_dagster.defs.alerts.signals import alerted_jobs, read_checks, read_failed_runs, read_recoveries
from recon_dagster.defs.telemetry import timed_tick

SENSOR_NAME = SENSOR  # "reconcile_alerts"
MAX_TRIES = 10
MAX_PENDING = 50
# A tick's deliveries end by this long after it began, well inside Dagster's sensor timeout
# (60 s): what is not delivered by then is owed, and the cursor (with the incidents) is saved.
DELIVERY_BUDGET_S = 20.0


def load_cursor(raw: str | None) -> dict[str, Any]:
    state: dict[str, Any] = {"checks": {}, "runs": None, "open": {}, "pending": [], "since": None}
    if raw:
        # A cursor from another version or edited by hand is read as none: start over.
        with contextlib.suppress(ValueError, TypeError):
            state.update(json.loads(raw))
    return state


def _alert_from(data: dict[str, Any]) -> Alert:
    fields = {k: v for k, v in data.items() if k in Alert.__dataclass_fields__}
    fields["links"] = tuple((link["text"], link["href"]) for link in data.get("links", []))
    return Alert(**fields)


def _hook() -> Callable[[Alert], Any] | None:
    hook: Callable[[Alert], Any] | None = settings().alert_hook
    return hook


def _log(context: dg.SensorEvaluationContext, alert: Alert) -> None:
    line = redact_secrets(f"{alert.action} {alert.key}: {alert.title}: {alert.summary}")
    if alert.action == "trigger":
        context.log.error(line)
    else:
        context.log.info(line)


def run_tick(
    context: dg.SensorEvaluationContext,
    targets: list[Target],
    *,
    timeout_s: float,
    ui_url: str | None,
    now: float | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """One tick: read, decide, deliver. Returns the new cursor state and one line per thing done."""
    started = time.monotonic()
    now = time.time() if now is None else now
    state = load_cursor(context.cursor)
    repository = context.repository_def
    assert repository is not None, "the alert sensor needs its code location"
    include_warn = settings().alert_min_severity == "warn"

    # Every check but the board's own (red while an incident is open: never an incident itself).
    check_keys = sorted(
        (k for k in repository.asset_graph.asset_check_keys if k.asset_key != OPEN_INCIDENTS),
        key=lambda k: k.to_user_string(),
    )
    notes: list[str] = []
    check_signals, state["checks"] = read_checks(
        context.instance,
        check_keys,
        state["checks"],
        since=state["since"],
        include_warn=include_warn,
        ui_url=ui_url,
        notes=notes,
    )
    for note in notes:
        context.log.warning(note)
    if state["since"] is None:
        state["since"] = now  # from now on a check seen for the first time is read from here
    run_signals, state["runs"] = read_failed_runs(
        context.instance, alerted_jobs(repository), state["runs"], now=now, ui_url=ui_url
    )
    book = IncidentBook(state["open"])
    alerts: list[Alert] = []
    # In the order they happened: a failed check opens the provider's incident before the failed
    # runs of the same outage arrive and are counted into it.
    signals: list[Signal] = sorted(check_signals + run_signals, key=lambda s: s.at)
    for signal in signals:
        alerts += book.observe(signal)
    for signal in read_recoveries(context.instance, book.state(), ui_url=ui_url):
        alerts += book.observe(signal)
    state["open"] = book.state()
    # Every alert says where its runbook is and what to do first (recon_dagster.alerting.runbook).
    alerts = [with_runbook(a, settings().alert_runbook_base_url) for a in alerts]

    done: list[str] = []
    hook = _hook()
    queue = [*_owed_from(state.get("pending", [])), *(Owed(a, t.name) for a in alerts for t in targets)]
    for alert in alerts:
        _log(context, alert)
        if hook is not None:
            try:
                hook(alert)
            except Exception as exc:  # custom code must not stop the built-in targets
                context.log.error(
                    redact_secrets(
                        f"{Settings.alert_hook.name} raised on {alert.key}: {type(exc).__name__}: {exc}"
                    )
                )
    if not queue:
        state["pending"] = []
        return state, done
    outcome = deliver_within(
        queue,
        targets,
        timeout_s=timeout_s,
        deadline=started + DELIVERY_BUDGET_S,
        # The process's shared TLS context: a client's own costs ~30 ms of CPU to load the CA bundle.
        client=lambda: httpx.Client(timeout=timeout_s, verify=shared_tls_context()),
        max_tries=MAX_TRIES,
        max_owed=MAX_PENDING,
    )
    sent: dict[tuple[str, str], list[str]] = {}
    for item in outcome.delivered:
        sent.setdefault((item.alert.action, item.alert.key), []).append(item.target)
    for (action, key), names in sent.items():
        done.append(f"{action} {key} -> {', '.join(sorted(names))}")
    if outcome.failed:
        done.append("failed: " + "; ".join(outcome.failed[n] for n in sorted(outcome.failed)))
    if outcome.owed:
        owed_to = ", ".join(sorted({i.target for i in outcome.owed}))
        done.append(f"{len(outcome.owed)} delivery(ies) owed to {owed_to}")
    for line in outcome.given_up:
        context.log.error(redact_secrets(line))
    if outcome.dropped:
        context.log.error(
            f"dropped the {outcome.dropped} oldest owed alert deliveries: more than {MAX_PENDING} were owed"
        )
    state["pending"] = [item.as_json() for item in outcome.owed]
    return state, done


def _owed_from(pending: list[dict[str, Any]]) -> list[Owed]:
    """The cursor's owed deliveries (one per alert and target; an older cursor's list of targets
    per alert is read as one each)."""
    out = []
    for item in pending:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            alert = _alert_from(item["alert"])
            names = [item["target"]] if "target" in item else list(item.get("targets", []))
            out += [Owed(alert, str(name), int(item.get("tries", 1))) for name in names]
    return out


@dg.sensor(
    name=SENSOR_NAME,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Alerts without Dagster+: every failed asset check (ERROR severity; WARN too with "
    f"{Settings.alert_min_severity.name}=warn) and every failed run of this location (the operator's own actions "
    "excepted) opens an incident; one alert when it opens, one when it turns green, to Slack, PagerDuty "
    f"(dedup_key per check and provider), Microsoft Teams, a JSON webhook ({PREFIX}ALERT_* settings) and "
    f"{Settings.alert_hook.name}. A reconcile run failed by its provider's outage belongs to that provider's "
    "health incident; a run whose worker went away (a deploy) pages only when such runs keep dying. "
    "With no target set, each alert is logged here. The incidents open now are the active_incidents "
    "asset (group recon_oncall), written by this sensor when one opens or resolves.",
)
@timed_tick("reconcile_alerts")
def reconcile_alerts(
    context: dg.SensorEvaluationContext, alert_targets: AlertTargetsResource
) -> dg.SensorResult:
    targets = alert_targets.targets()
    before = load_cursor(context.cursor)["open"]
    state, done = run_tick(context, targets, timeout_s=alert_targets.timeout_s, ui_url=alert_targets.ui_url)
    # The open incidents on a page of their own (``board``), when what it shows changed.
    events = board_events(state, before, base_url=settings().alert_runbook_base_url, now=time.time())
    context.update_cursor(json.dumps(state, sort_keys=True))
    open_now = ", ".join(sorted(state["open"])) or "none"
    if not targets:
        done.append("no alert target configured: alerts are only logged here")
    return dg.SensorResult(
        skip_reason=redact_secrets("; ".join(done + [f"open incidents: {open_now}"])), asset_events=events
    )
