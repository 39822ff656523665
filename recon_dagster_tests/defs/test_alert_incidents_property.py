"""The rule, over random histories: whatever sequence of check evaluations (partitions, re-runs,
runs that skip the check or fail before it, runless reports) and whatever the targets do
(answering, failing, hanging, recovering within the give-up), every target that answers ends up
with exactly the incident's transitions: one trigger when it opens and one resolve when it is over,
per check and partition, in order."""

from __future__ import annotations

import dagster as dg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recon_dagster.defs.alerts import sensor as alert_sensor
from recon_dagster.defs.alerts.resource import AlertTargetsResource
from recon_dagster_tests.support.alert_receivers import Receivers, alert_receivers
from recon_dagster_tests.support.alert_sensor import SensorTicks, webhook_actions
from recon_dagster_tests.support.check_runs import CheckTarget, check_targets, first_partition, store_check
from recon_dagster_tests.support.reconcile import make_defs

PARTITIONED_SHAPES = ["separate", "separate", "in_place", "skipped", "run_failed"]
UNPARTITIONED_SHAPES = ["separate", "runless", "skipped", "run_failed"]

evaluation = st.tuples(
    st.just("eval"), st.integers(0, 1), st.integers(0, 2), st.booleans(), st.integers(0, 4)
)
tick = st.just(("tick",))
flaky = st.tuples(st.just("slack"), st.sampled_from(["ok", "fail", "hang"]))
steps = st.lists(st.one_of(evaluation, evaluation, tick, flaky), min_size=1, max_size=14)


@pytest.fixture(scope="module")
def defs(tmp_path_factory: pytest.TempPathFactory) -> dg.Definitions:
    return make_defs(str(tmp_path_factory.mktemp("media")))


def _slack_actions(r: Receivers) -> list[tuple[str, str]]:
    out = []
    for req in r.accepted("/slack/"):
        body = req.json
        key = body["blocks"][-1]["elements"][-1]["text"].split("`")[1]
        out.append(("resolve" if body["text"].startswith("resolved:") else "trigger", key))
    return out


def _incident(target: CheckTarget, partition: str | None) -> str:
    base = f"check:{target.key.asset_key.to_user_string()}:{target.key.name}"
    return f"{base}[{partition}]" if partition else base


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=steps)
def test_every_answering_target_gets_one_trigger_and_one_resolve_per_incident(defs, history, monkeypatch):
    monkeypatch.setattr(alert_sensor, "DELIVERY_BUDGET_S", 2.0, raising=False)
    checks = check_targets(defs)
    chosen = [
        next(t for t in checks if t.partitions_def is None),
        next(t for t in checks if t.key.asset_key == dg.AssetKey("kie_spend")),
    ]
    model: dict[str, bool] = {}  # incident -> open
    expected: dict[str, list[str]] = {}
    failing_ticks = 0
    with dg.instance_for_test() as instance, alert_receivers() as receivers:
        targets = AlertTargetsResource(
            slack_webhook_url=receivers.slack_url, webhook_url=receivers.webhook_url, timeout_s=0.3
        )
        ticks = SensorTicks(defs, instance, targets)
        ticks()
        slack_down = False
        for step in history:
            if step[0] == "tick":
                ticks()
                failing_ticks += slack_down
            elif step[0] == "slack":
                receivers.answer_again("/slack/")
                receivers.fail_next("/slack/", 0)
                slack_down = step[1] != "ok"
                if step[1] == "fail":
                    receivers.fail_next("/slack/", 10_000)
                elif step[1] == "hang":
                    receivers.hang("/slack/")
            else:
                _, which, part, passed, shape_at = step
                target = chosen[which]
                shapes = UNPARTITIONED_SHAPES if target.partitions_def is None else PARTITIONED_SHAPES
                shape = shapes[shape_at % len(shapes)]
                partition = first_partition(target, part)
                store_check(instance, target, passed=passed, partition=partition, shape=shape)  # type: ignore[arg-type]
                if shape == "run_failed":
                    continue  # no verdict: its run's failure is the alert
                green = passed or shape == "skipped"
                key = _incident(target, partition)
                if not green and not model.get(key):
                    expected.setdefault(key, []).append("trigger")
                elif green and model.get(key):
                    expected.setdefault(key, []).append("resolve")
                model[key] = not green
        assert failing_ticks < alert_sensor.MAX_TRIES  # (never given up on: see the delivery tests)
        receivers.answer_again("/slack/")
        receivers.fail_next("/slack/", 0)
        ticks()
        ticks()

        for name, got in (("webhook", webhook_actions(receivers)), ("slack", _slack_actions(receivers))):
            per: dict[str, list[str]] = {}
            for action, key in got:
                per.setdefault(key, []).append(action)
            assert per == expected, (name, history, ticks.messages)
