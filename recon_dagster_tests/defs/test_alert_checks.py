"""How the alert sensor reads Dagster's asset check executions: one incident per check, and per
partition of a partitioned asset's check, opened by its failing evaluation and resolved only by a
passing evaluation of the same partition; a planned execution is never read as a verdict when its
evaluation exists, whatever row Dagster stored it in."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import dagster as dg
import pytest

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


def _webhook(r: Receivers) -> AlertTargetsResource:
    return AlertTargetsResource(webhook_url=r.webhook_url, timeout_s=5)


def incident(target: CheckTarget, partition: str | None) -> str:
    base = f"check:{target.key.asset_key.to_user_string()}:{target.key.name}"
    return f"{base}[{partition}]" if partition else base


def _target(defs: dg.Definitions, asset: str) -> CheckTarget:
    return next(t for t in check_targets(defs) if t.key.asset_key == dg.AssetKey(asset))


def test_the_stored_shapes_are_dagsters_own() -> None:
    """``store_check`` writes the rows a real run of a partitioned asset's check writes: a planned
    row with the partition, and the evaluation in a row of its own without it."""
    daily = dg.DailyPartitionsDefinition(start_date="2026-01-01")

    @dg.asset(partitions_def=daily, check_specs=[dg.AssetCheckSpec("c", asset="a")])
    def a() -> dg.MaterializeResult:  # type: ignore[type-arg]
        return dg.MaterializeResult(check_results=[dg.AssetCheckResult(check_name="c", passed=False)])

    key = dg.AssetCheckKey(dg.AssetKey("a"), "c")

    def shapes(instance: dg.DagsterInstance) -> list[tuple[str, str | None, bool]]:
        rows = instance.event_log_storage.get_asset_check_execution_history(key, limit=10)
        return [(r.status.value, r.partition, r.evaluation is not None) for r in rows]

    with tempfile.TemporaryDirectory() as d, dg.instance_for_test(temp_dir=d) as real:
        assert dg.materialize([a], instance=real, partition_key="2026-01-02").success
        with dg.instance_for_test() as stored:
            store_check(stored, CheckTarget(key, daily), passed=False, partition="2026-01-02")
            assert shapes(stored) == shapes(real) == [("FAILED", None, True), ("PLANNED", "2026-01-02", True)]


def test_a_red_day_is_resolved_only_by_its_own_green(instance, defs, receivers):
    """Yesterday's provisional (green) spend report never resolves the page of a final day whose
    bill is still wrong; that day's own green does."""
    ticks = SensorTicks(defs, instance, _webhook(receivers))
    ticks()
    spend = _target(defs, "anthropic_spend")
    red_day, other_day = first_partition(spend, 3), first_partition(spend, 4)
    store_check(instance, spend, passed=False, partition=red_day)
    ticks()
    store_check(instance, spend, passed=True, partition=other_day)
    ticks()
    assert per_incident(webhook_actions(receivers)) == {incident(spend, red_day): ["trigger"]}, ticks.messages
    store_check(instance, spend, passed=True, partition=red_day)
    ticks()
    assert per_incident(webhook_actions(receivers)) == {incident(spend, red_day): ["trigger", "resolve"]}


def _sequences(target: CheckTarget) -> list[tuple[str, str, str]]:
    """How each of failing, failing again, passing is stored. Dagster stores one runless
    evaluation per partition at most (a second one breaks its unique index), and in a run an
    unpartitioned evaluation always updates its planned row."""
    if target.partitions_def is None:
        return [("separate",) * 3, ("runless",) * 3]  # type: ignore[list-item]
    return [("separate",) * 3, ("in_place",) * 3, ("runless", "separate", "in_place")]  # type: ignore[list-item]


def _cases(defs: dg.Definitions) -> list[tuple[CheckTarget, int, tuple[str, str, str]]]:
    return [(t, n, shapes) for t in check_targets(defs) for n, shapes in enumerate(_sequences(t))]


def test_every_check_of_the_definitions_pages_once_per_persistent_failure(instance, defs, receivers):
    """Each check, in each shape Dagster stores it: failing, re-evaluated failing (a re-run, a
    backfill), then passing, is one trigger and one resolve; a partitioned check's other partition
    failing meanwhile is an incident of its own."""
    cases = _cases(defs)
    assert any(t.partitions_def is not None for t, _, _ in cases)
    assert any(t.partitions_def is None for t, _, _ in cases)
    ticks = SensorTicks(defs, instance, _webhook(receivers))
    ticks()
    expected: dict[str, list[str]] = {}
    for target, n, shapes in cases:
        p, q = first_partition(target, 2 * n), first_partition(target, 2 * n + 1)
        for passed, shape in zip((False, False, True), shapes, strict=True):
            store_check(instance, target, passed=passed, partition=p, shape=shape)  # type: ignore[arg-type]
            ticks()
        expected.setdefault(incident(target, p), []).extend(["trigger", "resolve"])
        if q is not None:  # two runs of another partition in one tick, then a run that skips it
            store_check(instance, target, passed=False, partition=q, shape=shapes[1])  # type: ignore[arg-type]
            store_check(instance, target, passed=False, partition=q, shape=shapes[1])  # type: ignore[arg-type]
            ticks()
            store_check(instance, target, passed=True, partition=q, shape="skipped")
            ticks()
            expected.setdefault(incident(target, q), []).extend(["trigger", "resolve"])
    got = per_incident(webhook_actions(receivers))
    wrong = {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
    extra = set(got) - set(expected)
    assert not wrong and not extra, (wrong, extra, ticks.messages[-3:])
    assert ticks.open == {}


def test_a_check_whose_run_failed_before_it_ran_neither_pages_nor_resolves(instance, defs, receivers):
    ticks = SensorTicks(defs, instance, _webhook(receivers))
    spend = _target(defs, "replicate_spend")
    day = first_partition(spend, 1)
    store_check(instance, spend, passed=False, partition=day)
    ticks()
    store_check(instance, spend, passed=True, partition=day, shape="run_failed")
    ticks()
    assert webhook_actions(receivers) == [("trigger", incident(spend, day))]
