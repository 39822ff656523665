"""Alert delivery when a target does not answer: every tick ends inside its own budget, the
targets that answer get each alert once, a dead target is given up on with one log line, and
what is dropped (owed deliveries past 50, evaluations past 25 a tick) is said in the log. Last, a
real ``dagster-daemon`` with a receiver that never answers beside one that works."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import dagster as dg
import pytest

from recon_dagster.defs.alerts import sensor as alert_sensor
from recon_dagster.defs.alerts.resource import AlertTargetsResource
from recon_dagster_tests.support.alert_receivers import Receivers, alert_receivers
from recon_dagster_tests.support.alert_sensor import SensorTicks, per_incident, webhook_actions
from recon_dagster_tests.support.check_runs import CheckTarget, check_targets, first_partition, store_check
from recon_dagster_tests.support.reconcile import make_defs


@pytest.fixture
def receivers() -> Iterator[Receivers]:
    with alert_receivers() as r:
        yield r


@pytest.fixture(scope="module")
def defs(tmp_path_factory: pytest.TempPathFactory) -> dg.Definitions:
    return make_defs(str(tmp_path_factory.mktemp("media")))


def _unpartitioned(defs: dg.Definitions, n: int) -> list[CheckTarget]:
    found = [t for t in check_targets(defs) if t.partitions_def is None]
    assert len(found) >= n
    return found[:n]


def _runless(instance: dg.DagsterInstance, target: CheckTarget, passed: bool) -> None:
    store_check(instance, target, passed=passed, shape="runless")


def _incident(target: CheckTarget) -> str:
    return f"check:{target.key.asset_key.to_user_string()}:{target.key.name}"


def test_a_target_that_never_answers_holds_up_no_other_and_is_given_up_once(
    instance, defs, receivers, monkeypatch
):
    monkeypatch.setattr(alert_sensor, "DELIVERY_BUDGET_S", 3.0, raising=False)
    receivers.hang("/slack/")
    targets = AlertTargetsResource(
        slack_webhook_url=receivers.slack_url, webhook_url=receivers.webhook_url, timeout_s=0.5
    )
    ticks = SensorTicks(defs, instance, targets)
    ticks()
    checks = _unpartitioned(defs, 7)
    for target in checks:
        _runless(instance, target, passed=False)
    for _ in range(alert_sensor.MAX_TRIES + 2):
        ticks()

    assert per_incident(webhook_actions(receivers)) == {_incident(t): ["trigger"] for t in checks}
    gave_up = [line for level, line in ticks.log if "gave up" in line]
    assert len(gave_up) == 1 and "slack" in gave_up[0], gave_up
    assert receivers.slack_url not in gave_up[0]
    assert json.loads(ticks.cursor or "{}")["pending"] == []

    # Slack answers again: the resolves reach both, once each.
    receivers.answer_again("/slack/")
    for target in checks:
        _runless(instance, target, passed=True)
    ticks()
    ticks()
    assert per_incident(webhook_actions(receivers)) == {_incident(t): ["trigger", "resolve"] for t in checks}
    slack = [
        req.json["blocks"][-1]["elements"][-1]["text"].split("`")[1] for req in receivers.accepted("/slack/")
    ]
    assert sorted(slack) == sorted(_incident(t) for t in checks)


def test_a_target_down_for_a_while_gets_every_alert_once_in_order_when_it_recovers(instance, defs, receivers):
    targets = AlertTargetsResource(webhook_url=receivers.webhook_url, timeout_s=2)
    ticks = SensorTicks(defs, instance, targets)
    ticks()
    [target] = _unpartitioned(defs, 1)
    receivers.fail_next("/hook/", 3)
    _runless(instance, target, passed=False)
    ticks()
    _runless(instance, target, passed=True)
    for _ in range(4):
        ticks()
    assert webhook_actions(receivers) == [("trigger", _incident(target)), ("resolve", _incident(target))]


def test_owed_deliveries_past_fifty_are_dropped_with_one_line(instance, defs, receivers):
    targets = AlertTargetsResource(webhook_url=receivers.webhook_url, timeout_s=2)
    ticks = SensorTicks(defs, instance, targets)
    ticks()
    spend = next(t for t in check_targets(defs) if t.key.asset_key == dg.AssetKey("replicate_spend"))
    receivers.fail_next("/hook/", 1000)
    for batch in range(5):  # 12 red days a tick (two execution rows each: a tick reads 25)
        for n in range(12):
            store_check(instance, spend, passed=False, partition=first_partition(spend, 12 * batch + n))
        ticks()
    dropped = [line for _, line in ticks.log if "dropped" in line]
    assert dropped == [
        f"dropped the 10 oldest owed alert deliveries: more than {alert_sensor.MAX_PENDING} were owed"
    ]
    assert len(json.loads(ticks.cursor or "{}")["pending"]) == alert_sensor.MAX_PENDING


def test_evaluations_left_unread_past_twenty_five_are_said_in_the_log(instance, defs, receivers):
    ticks = SensorTicks(defs, instance, AlertTargetsResource(webhook_url=receivers.webhook_url, timeout_s=2))
    [target] = _unpartitioned(defs, 1)
    _runless(instance, target, passed=True)
    ticks()
    for _ in range(30):
        _runless(instance, target, passed=False)
    ticks()
    unread = [line for level, line in ticks.log if "unread" in line]
    assert unread == [
        f"{target.key.to_user_string()}: 5 evaluation(s) older than the latest 25 since the last tick were left unread"
    ], ticks.log
    assert webhook_actions(receivers) == [("trigger", _incident(target))]


def _alert_ticks(inst: dg.DagsterInstance) -> list[object]:
    """The alert sensor's ticks so far, newest first (as the daemon recorded them)."""
    from dagster._core.scheduler.instigation import InstigatorType

    for state in inst.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        if state.instigator_name == alert_sensor.SENSOR_NAME:
            return list(inst.get_ticks(state.instigator_origin_id, state.selector_id, limit=100))
    return []


@pytest.mark.daemon
@pytest.mark.slow
def test_through_the_daemon_a_receiver_that_never_answers_costs_no_tick_and_no_duplicate(
    db, database_url, tmp_path, receivers
):
    """The shipped defaults (10 s per delivery, Dagster's 60 s sensor timeout): seven incidents
    open at once while Slack accepts the connection and never answers. Before, the tick's serial
    deliveries (7 x 10 s) outlived the timeout, the daemon kept the old cursor and the webhook got
    every alert again at every tick. Now every tick ends, the webhook gets one trigger and one
    resolve per incident."""
    from dagster._core.scheduler.instigation import TickStatus

    from recon_dagster_tests.support.daemon import daemon_process
    from recon_dagster_tests.support.harness import wait_for
    from recon_dagster_tests.support.instance import dagster_home

    receivers.hang("/slack/")
    defs = make_defs(str(tmp_path / "media"))
    checks = _unpartitioned(defs, 7)
    env = {
        "RECON_DATABASE_URL": database_url,
        "RECON_MEDIA_DIR": str(tmp_path / "media"),
        "RECON_ALERT_SLACK_WEBHOOK_URL": receivers.slack_url,
        "RECON_ALERT_WEBHOOK_URL": receivers.webhook_url,
        "DAGSTER_GRPC_TIMEOUT_SECONDS": "60",
        "DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS": "60",
    }
    incidents = {_incident(t) for t in checks}
    with dagster_home(database_url) as home, daemon_process(home, env) as daemon, home.instance() as inst:

        def ticks_after(at: float) -> list[object]:
            return [t for t in _alert_ticks(inst) if t.timestamp > at and t.status != TickStatus.STARTED]  # type: ignore[attr-defined]

        def ours() -> dict[str, list[str]]:
            """The webhook's alerts of this test's incidents. The daemon also runs the shipped
            schedules (reconcile_health_schedule every 5 minutes, the orphan sweep, provider
            health): under load a check of theirs may page too (the reconcile sensor late a
            tick, a run that failed to start), which says nothing of these seven."""
            return {k: v for k, v in per_incident(webhook_actions(receivers)).items() if k in incidents}

        def delivered(action: str) -> bool:
            got = ours()
            return all(action in got.get(i, []) for i in incidents)

        def settled(action: str) -> None:
            """Wait for every incident's ``action`` at the webhook, then for two whole ticks begun
            after the last of them (a duplicate or a wedged tick would show there). On the
            conditions, not on a count of ticks since a moment: under load a tick that begins
            while the evaluations are being written reads only some of them, and a tick can
            take long, so "N ticks after" did not mean "delivered"."""
            wait_for(
                lambda: delivered(action), timeout_s=600, interval_s=1,
                what=f"a {action} of every incident at the webhook", logs=daemon.log_tail,
            )  # fmt: skip
            after = _now()
            wait_for(
                lambda: len(ticks_after(after)) >= 2, timeout_s=600, interval_s=1,
                what=f"two alert ticks after the last {action}", logs=daemon.log_tail,
            )  # fmt: skip

        wait_for(
            lambda: ticks_after(0), timeout_s=300, what="the alert sensor's first tick", logs=daemon.log_tail
        )
        red_at = _now()
        for target in checks:
            _runless(inst, target, passed=False)
        settled("trigger")
        assert ours() == {i: ["trigger"] for i in incidents}
        for target in checks:
            _runless(inst, target, passed=True)
        settled("resolve")
        statuses = [(t.status, t.tick_data.error) for t in ticks_after(red_at)]  # type: ignore[attr-defined]

    assert all(status != TickStatus.FAILURE for status, _ in statuses), statuses
    assert ours() == {i: ["trigger", "resolve"] for i in incidents}
    # Whatever else paged was paged once per change: never the same action twice in a row.
    for key, actions in per_incident(webhook_actions(receivers)).items():
        assert all(a != b for a, b in itertools.pairwise(actions)), (key, actions)
    assert receivers.accepted("/slack/") == []


def _now() -> float:
    import time

    return time.time()
