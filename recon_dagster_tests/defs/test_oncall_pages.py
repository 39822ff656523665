"""Issue 55, item 8: pages that read.

- ``active_incidents``: the alert sensor's open incidents as an asset, written on the tick an
  incident opens and on the tick it resolves (and never on a tick that changed nothing), each row
  with what, since when, severity, its first step and runbook; the sensor's cursor and alerts as
  before.
- The Catalog leads with the on-call group (``recon_oncall``): the open incidents, provider health
  and the stuck jobs.
- ``reconcile_outcomes`` and ``outcomes_by_provider``: one plot per kind and figure, labelled with
  its unit, and never a series that is zero all along (Dagster draws a flat panel for it).
- A ``stuck_jobs`` row's story link opens a page that exists, for a job no run recorded a story for.
"""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
import pytest

from recon_dagster.defs.alerts.resource import AlertTargetsResource
from recon_dagster.defs.alerts.sensor import reconcile_alerts
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import make_job, make_user
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick

HEALTH = dg.AssetKey("provider_health")
BOARD = dg.AssetKey("active_incidents")


class Ticks:
    """The alert sensor ticked as the daemon does (cursor carried over), with no target set."""

    def __init__(self, defs: dg.Definitions, instance: dg.DagsterInstance):
        self.repository, self.instance = defs.get_repository_def(), instance
        self.cursor: str | None = None

    def __call__(self) -> list[Any]:
        """The tick's ``active_incidents`` materializations; its asset events stored as the daemon does."""
        with dg.build_sensor_context(
            instance=self.instance,
            repository_def=self.repository,
            cursor=self.cursor,
            resources={"alert_targets": AlertTargetsResource()},
            sensor_name="reconcile_alerts",
        ) as ctx:
            result = reconcile_alerts.evaluate_tick(ctx)
        self.cursor = result.cursor
        for event in result.asset_events:
            self.instance.report_runless_asset_event(event)
        self.checks = [e for e in result.asset_events if isinstance(e, dg.AssetCheckEvaluation)]
        return [
            e for e in result.asset_events if isinstance(e, dg.AssetMaterialization) and e.asset_key == BOARD
        ]

    @property
    def open(self) -> dict[str, Any]:
        return dict(json.loads(self.cursor or "{}").get("open", {}))


def _check(instance: dg.DagsterInstance, name: str, passed: bool) -> None:
    instance.report_runless_asset_event(
        dg.AssetCheckEvaluation(
            asset_key=HEALTH,
            check_name=name,
            passed=passed,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"{name} {'healthy' if passed else 'DOWN: 8 of 8 job(s) got no answer'}",
            metadata={"jobs": 8},
        )
    )


def _rows(event: Any) -> list[dict[str, Any]]:
    return [r.data for r in event.metadata["table"].value.records]


def test_open_incidents_is_written_when_an_incident_opens_and_when_it_resolves(instance, media_dir):
    ticks = Ticks(make_defs(media_dir), instance)
    [first] = ticks()  # the first look: the board exists, empty
    assert first.metadata["open incidents (count)"].value == 0 and _rows(first) == []
    assert ticks() == []  # nothing changed: nothing written

    _check(instance, "elevenlabs", False)
    [opened] = ticks()
    [row] = _rows(opened)
    assert row["incident"] == "check:provider_health:elevenlabs"
    assert row["what"] == "elevenlabs is DOWN (provider_health)"
    assert row["severity"] == "error" and row["provider"] == "elevenlabs"
    assert row["since"].endswith("UTC") and row["seen_failing"] == 1
    assert row["first_step"].startswith("Read the alert's last reason")
    assert row["runbook"].endswith("operations.md#runbook-provider-health")
    assert opened.metadata["open incidents (count)"].value == 1
    assert "opened check:provider_health:elevenlabs" in opened.metadata["changed"].value
    assert "[runbook](" in opened.metadata["incidents"].value
    # Its check is red while the incident is open; the sensor never makes that an incident.
    [red] = ticks.checks
    assert (red.asset_key, red.check_name, red.passed) == (BOARD, "none_open", False)
    assert "elevenlabs is DOWN" in (red.description or "")

    _check(instance, "elevenlabs", False)  # still down: counted in the cursor, the board unchanged
    assert ticks() == []
    assert ticks.open["check:provider_health:elevenlabs"]["count"] == 2
    assert list(ticks.open) == ["check:provider_health:elevenlabs"]

    _check(instance, "elevenlabs", True)
    [resolved] = ticks()
    assert _rows(resolved) == [] and resolved.metadata["open incidents (count)"].value == 0
    assert resolved.metadata["changed"].value == "resolved check:provider_health:elevenlabs"
    assert [c.passed for c in ticks.checks] == [True]
    assert ticks.open == {} and ticks() == []


def test_a_lost_board_is_written_again_from_the_cursor(instance, media_dir):
    """A cursor without ``shown`` (from before the board, or its tick's result lost) shows the
    incidents it holds open at the next tick."""
    ticks = Ticks(make_defs(media_dir), instance)
    ticks()
    _check(instance, "kie", False)
    ticks()
    state = json.loads(ticks.cursor or "{}")
    del state["shown"]
    ticks.cursor = json.dumps(state)
    [again] = ticks()
    assert [r["incident"] for r in _rows(again)] == ["check:provider_health:kie"]


def test_the_catalog_leads_with_the_oncall_group(media_dir):
    graph = make_defs(media_dir).get_repository_def().asset_graph
    groups: dict[str, set[str]] = {}
    for key in graph.get_all_asset_keys():
        groups.setdefault(graph.get(key).group_name, set()).add(key.to_user_string())
    assert {"active_incidents", "provider_health", "stuck_jobs"} <= groups["recon_oncall"]
    assert "reconcile_outcomes" in groups["reconciliation"]
    # Dagster lists groups by name: on-call first.
    assert sorted(groups)[0] == "recon_oncall", sorted(groups)


def _points(instance: dg.DagsterInstance, key: dg.AssetKey) -> list[dict[str, Any]]:
    records = instance.fetch_materializations(key, limit=100, ascending=True).records
    return [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in records]


def _numeric_series(points: list[dict[str, Any]]) -> dict[str, list[Any]]:
    series: dict[str, list[Any]] = {}
    for p in points:
        for k, v in p.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                series.setdefault(k, []).append(v)
    return series


@pytest.mark.slow
def test_outcome_plots_are_per_kind_labelled_and_never_flat_zero(db, instance, media_dir, sandbox):
    defs = make_defs(media_dir, cadence_seconds=0, single_run_below=5)
    # Run 1: one KIE job fails upstream (refunded), one recovers; run 2 and 3: only recoveries.
    stale_job_with_task(db, sandbox, "kie-standard", Scenario(outcome="fail", polls_before_done=0))
    stale_job_with_task(db, sandbox, "kie-standard")
    tick(defs, instance)
    stale_job_with_task(db, sandbox, "kie-standard")
    tick(defs, instance)
    stale_job_with_task(db, sandbox, "kie-standard")
    tick(defs, instance)

    for key in (dg.AssetKey("reconcile_outcomes"), dg.AssetKey(["outcomes_by_provider", "kie"])):
        series = _numeric_series(_points(instance, key))
        assert series, key
        # Each plot is one kind's figure with its unit; none is zero all along.
        assert all(k.startswith("kie-standard: ") and k.endswith(("(jobs)", "(credits)")) for k in series)
        assert not [k for k, values in series.items() if not any(values)], series
        assert series["kie-standard: recovered (jobs)"] == [1, 1, 1]
        # The failure: 1, then one 0 (the line falls), then nothing more.
        assert series["kie-standard: failed_refunded (jobs)"] == [1, 0], series
        assert "kie-standard: errors (jobs)" not in series and "kie-standard: swept (jobs)" not in series


def test_a_stuck_job_no_run_told_links_to_a_story_page_that_exists(db, instance, media_dir):
    user = make_user(db)
    # In flight, counted 5 attempts, no reconcile event: stuck ("no record"), no run recorded its story.
    job = make_job(
        db,
        user,
        provider_kind="replicate-prediction",
        provider_task_id="r-unseen",
        started_minutes_ago=600,
        reconcile_attempts=5,
    )
    defs = make_defs(media_dir)
    assert defs.resolve_job_def("reconcile_health_job").execute_in_process(instance=instance).success

    event = instance.get_latest_materialization_event(dg.AssetKey("stuck_jobs"))
    assert event is not None and event.asset_materialization is not None
    rows = {r.data["job_id"]: r.data for r in event.asset_materialization.metadata["table"].value.records}
    link = rows[str(job)]["story"]
    assert "/assets/job_story" in link and str(job) in link
    # The page the link opens: the job's partition, with its story recorded.
    assert instance.has_dynamic_partition("recon_job", str(job))
    story = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("job_story"), asset_partitions=[str(job)]), limit=1
    ).records
    assert story and "story" in story[0].asset_materialization.metadata


def test_a_row_whose_story_was_not_recorded_names_the_command_instead():
    from recon_dagster.defs.observe.stuck import story_cell

    assert story_cell("j1", "http://ui", {"j1"}) == "http://ui/assets/job_story?view=partitions&partition=j1"
    assert story_cell("j2", "http://ui", {"j1"}) == "recon-dagster explain j2"
