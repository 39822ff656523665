"""Which of Dagster's asset check execution rows is a verdict, and for which partition.

Dagster 1.13 stores the executions of a check in ``asset_check_executions``, in one of these
shapes (``event_log_storage.get_asset_check_execution_history`` returns the rows):

- **In a run**: the run first stores ``ASSET_CHECK_EVALUATION_PLANNED``, one PLANNED row per
  partition of the run's subset (one row without a partition for an unpartitioned asset). Its
  ``ASSET_CHECK_EVALUATION`` then updates the planned row of the same run and partition, when the
  evaluation names that partition (an unpartitioned check, or a check spec with its own
  ``partitions_def``). An evaluation that names no partition (the ``AssetCheckResult`` of a
  partitioned asset's own check spec, as the spend assets yield) matches no planned row: Dagster
  stores it as a row of its own, without a partition, and the planned row stays PLANNED although
  the check ran.
- **Runless** (``report_runless_asset_event``): one row per evaluation, with the partition it
  names.
- **Planned, never evaluated**: the run skipped the check (an idle provider's health check), failed
  before it ran, or is still going. Rows older than Dagster's planned events carry no event.

So the verdict is always the evaluation, never the plan: a PLANNED row whose run stored an
evaluation of the check (for its partition or for none) is passed over, and an evaluation without
a partition stands for the partitions its run planned. Reading the PLANNED row of a run that
succeeded as "nothing failing" made a red partition resolve and page again at every re-run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import dagster as dg
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecord,
    AssetCheckExecutionRecordStatus,
)


@dataclass(frozen=True)
class RunChecks:
    """What one run stored for a check: the partitions it planned and those it evaluated
    (None: an evaluation that names no partition)."""

    planned: frozenset[str | None] = frozenset()
    evaluated: frozenset[str | None] = frozenset()


@dataclass
class RunReader:
    """The runs' check events, read once per run and tick."""

    instance: dg.DagsterInstance
    _runs: dict[str, dict[dg.AssetCheckKey, RunChecks]] = field(default_factory=dict)

    def checks(self, run_id: str, key: dg.AssetCheckKey) -> RunChecks:
        if not run_id:
            return RunChecks()
        if run_id not in self._runs:
            self._runs[run_id] = self._read(run_id)
        return self._runs[run_id].get(key, RunChecks())

    def _read(self, run_id: str) -> dict[dg.AssetCheckKey, RunChecks]:
        planned: dict[dg.AssetCheckKey, set[str | None]] = {}
        evaluated: dict[dg.AssetCheckKey, set[str | None]] = {}
        kinds = {
            dg.DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED,
            dg.DagsterEventType.ASSET_CHECK_EVALUATION,
        }
        for entry in self.instance.all_logs(run_id, of_type=kinds):
            event = entry.dagster_event
            data = event.event_specific_data if event is not None else None
            if event is None or data is None:
                continue
            key = dg.AssetCheckKey(data.asset_key, data.check_name)  # type: ignore[union-attr]
            if event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
                evaluated.setdefault(key, set()).add(data.partition)  # type: ignore[union-attr]
            else:
                subset = data.partitions_subset  # type: ignore[union-attr]
                keys: Iterable[str | None] = subset.get_partition_keys() if subset is not None else [None]
                planned.setdefault(key, set()).update(keys)
        return {
            key: RunChecks(frozenset(planned.get(key, ())), frozenset(evaluated.get(key, ())))
            for key in planned.keys() | evaluated.keys()
        }


def evaluated_by_its_run(record: AssetCheckExecutionRecord, runs: RunReader) -> bool:
    """A PLANNED row whose run stored the check's evaluation for its partition (or for none):
    the evaluation's own row is the verdict."""
    if record.status is not AssetCheckExecutionRecordStatus.PLANNED:
        return False
    evaluated = runs.checks(record.run_id, record.key).evaluated
    return None in evaluated or record.partition in evaluated


def partitions_of(record: AssetCheckExecutionRecord, runs: RunReader) -> list[str | None]:
    """The partitions an evaluation row judges: its own, else the one its evaluation names,
    else those its run planned (an evaluation without a partition of a partitioned asset's
    check), else none (an unpartitioned check)."""
    if record.partition is not None:
        return [record.partition]
    evaluation = record.evaluation
    if evaluation is not None and getattr(evaluation, "partition", None) is not None:
        return [evaluation.partition]
    planned = sorted(p for p in runs.checks(record.run_id, record.key).planned if p is not None)
    return list(planned) or [None]
