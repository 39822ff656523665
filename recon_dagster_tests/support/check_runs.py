"""Asset check executions stored as Dagster 1.13 stores them, without running the asset.

A run that executes a check first reports ``ASSET_CHECK_EVALUATION_PLANNED`` (one execution row
per partition of its subset, status PLANNED), then ``ASSET_CHECK_EVALUATION``. An evaluation that
names no partition (an ``AssetCheckResult`` of a partitioned asset: Dagster fills the partition
only for a check spec with its own ``partitions_def``) matches no planned row and is stored as a
row of its own, without a partition; one that names it updates the planned row. A runless
evaluation (``report_runless_asset_event``) is a row of its own. ``test_alert_checks`` checks
these shapes against a real materialization once, so the other tests may store them directly
(milliseconds instead of a run each).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationPlanned

# How the evaluation is stored: "separate" (in a run, without its partition: the default of a
# partitioned asset's check result), "in_place" (in a run, naming its partition), "runless",
# "skipped" (planned, never evaluated, by a run that succeeded), "run_failed" (planned, its run
# failed before the check ran).
Shape = Literal["separate", "in_place", "runless", "skipped", "run_failed"]


@dataclass(frozen=True)
class CheckTarget:
    key: dg.AssetCheckKey
    partitions_def: dg.PartitionsDefinition | None  # the asset's


def check_targets(defs: dg.Definitions) -> list[CheckTarget]:
    """Every asset check of ``defs`` the alert sensor pages on, with its asset's partitions: all
    but ``active_incidents``' own (red while an incident is open, never an incident itself)."""
    graph = defs.get_repository_def().asset_graph
    return [
        CheckTarget(key, graph.get(key.asset_key).partitions_def)
        for key in sorted(graph.asset_check_keys, key=lambda k: k.to_user_string())
        if key.asset_key != dg.AssetKey("active_incidents")
    ]


def store_check(
    instance: dg.DagsterInstance,
    target: CheckTarget,
    *,
    passed: bool,
    partition: str | None = None,
    shape: Shape = "separate",
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
    description: str = "",
) -> str:
    """One execution of ``target``'s check as a run (or a runless report) stores it; its run id."""
    key = target.key
    evaluation = dg.AssetCheckEvaluation(
        asset_key=key.asset_key,
        check_name=key.name,
        passed=passed,
        severity=severity,
        description=description or f"{key.name} {'passed' if passed else 'failed'}",
        metadata={"partition_seen": partition or "-"},
        partition=partition if shape in ("in_place", "runless") else None,
    )
    if shape == "runless":
        instance.report_runless_asset_event(evaluation)
        return ""
    run_id = str(uuid.uuid4())
    tags = {"dagster/partition": partition} if partition else {}
    status = dg.DagsterRunStatus.FAILURE if shape == "run_failed" else dg.DagsterRunStatus.SUCCESS
    run = instance.add_run(dg.DagsterRun(job_name="__check_job__", run_id=run_id, status=status, tags=tags))
    # The subset exactly as Dagster plans it: from the run's partition tags.
    subset = run.get_resolved_partitions_subset_for_events(target.partitions_def)
    planned = AssetCheckEvaluationPlanned(
        asset_key=key.asset_key, check_name=key.name, partitions_subset=subset
    )
    instance.report_dagster_event(
        dg.DagsterEvent(
            event_type_value=dg.DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED.value,
            job_name="__check_job__",
            event_specific_data=planned,
        ),
        run_id=run_id,
    )
    if shape in ("separate", "in_place"):
        instance.report_dagster_event(
            dg.DagsterEvent(
                event_type_value=dg.DagsterEventType.ASSET_CHECK_EVALUATION.value,
                job_name="__check_job__",
                event_specific_data=evaluation,
            ),
            run_id=run_id,
        )
    return run_id


def first_partition(target: CheckTarget, offset: int = 0) -> str | None:
    """A partition key of ``target``'s asset (``offset`` further on), None when unpartitioned."""
    if target.partitions_def is None:
        return None
    if isinstance(target.partitions_def, dg.TimeWindowPartitionsDefinition):
        first = target.partitions_def.get_first_partition_key()
        assert first is not None
        key = first
        for _ in range(offset):
            nxt = target.partitions_def.get_next_partition_key(key)
            assert nxt is not None
            key = nxt
        return key
    return target.partitions_def.get_partition_keys()[offset]
