"""``reconcile --once``: one sensor tick, its runs executed in-process, then one sync sweep.

The operator's "reconcile now", and the path CI and the demo take: the same sensor, jobs and
resources the daemon uses, minus the daemon.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import sqlalchemy as sa

from recon_dagster.core.runtags import RUN_KEY_TAG
from recon_dagster.reconcile.reconciler import Summary

# The op of each job whose output is the run's summary.
REPORT_OPS = ("record_outcomes", "sweep_unrecoverable_jobs")


@dataclass
class OnceReport:
    scanned: int = 0
    runs: int = 0
    failed_runs: int = 0
    skip_reason: str | None = None
    summary: Summary = field(default_factory=Summary)
    # Due jobs left in flight per provider without its key (the sensor requests no run for them).
    unconfigured: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        return f"{self.summary.line()} runs={self.runs} failedRuns={self.failed_runs}"


@contextmanager
def _instance(instance: dg.DagsterInstance | None) -> Iterator[dg.DagsterInstance]:
    if instance is not None:
        yield instance
        return
    import os

    if os.environ.get("DAGSTER_HOME"):
        with dg.DagsterInstance.get() as inst:
            yield inst
        return
    # Sensor contexts need a persistent instance; a throwaway one in a temp dir serves here.
    with dg.instance_for_test() as inst:
        yield inst


def evaluate_sensor(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None = None) -> Any:
    """Evaluate the stale-jobs sensor once, with just the resources it requires.

    Returns Dagster's tick data: ``run_requests``, ``skip_message``, ``cursor``.
    """
    sensor = defs.resolve_sensor_def("stale_inflight_jobs_sensor")
    resources = {k: (defs.resources or {})[k] for k in sensor.required_resource_keys}
    with dg.build_sensor_context(
        instance=instance,
        resources=resources,
        repository_def=defs.get_repository_def(),
        sensor_name=sensor.name,
        cursor=cursor,
    ) as ctx:
        return sensor.evaluate_tick(ctx)


def _unconfigured_due(defs: dg.Definitions) -> Counter[str]:
    from recon_dagster.defs.reconcile.sensors import unconfigured_due

    resources = defs.resources or {}
    return unconfigured_due(resources["database"], resources["reconcile_settings"])


def reconcile_once(
    defs: dg.Definitions | None = None,
    *,
    instance: dg.DagsterInstance | None = None,
    sweep: bool = True,
) -> OnceReport:
    if defs is None:
        from recon_dagster.definitions import defs as default_defs

        defs = default_defs
    started = time.monotonic()
    report = OnceReport()
    with _instance(instance) as inst:
        result = evaluate_sensor(defs, inst)
        report.skip_reason = result.skip_message
        report.unconfigured = _unconfigured_due(defs)
        job = defs.resolve_job_def("reconcile_job")
        for rr in result.run_requests or []:
            report.runs += 1
            # The run key is the lease owner, as under the daemon (and it shows in the run's tags).
            tags = {**rr.tags, RUN_KEY_TAG: rr.run_key, "recon/trigger": "reconcile-once"}
            ok = _execute(job, inst, rr.run_config, rr.partition_key, tags, report.summary)
            report.failed_runs += 0 if ok else 1
        if sweep:
            report.runs += 1
            sweep_job = defs.resolve_job_def("sync_sweep_job")
            ok = _execute(sweep_job, inst, {}, None, {"recon/trigger": "reconcile-once"}, report.summary)
            report.failed_runs += 0 if ok else 1
    report.summary.elapsed_ms = int((time.monotonic() - started) * 1000)
    return report


def _execute(
    job: dg.JobDefinition,
    inst: dg.DagsterInstance,
    run_config: Mapping[str, Any] | None,
    partition_key: str | None,
    tags: Mapping[str, str],
    summary: Summary,
) -> bool:
    # Outcome lines are INFO; Dagster's console logger would add every DEBUG engine event.
    run_config = {**(run_config or {}), "loggers": {"console": {"config": {"log_level": "INFO"}}}}
    res = job.execute_in_process(
        run_config=run_config, instance=inst, partition_key=partition_key, tags=tags, raise_on_error=False
    )
    if not res.success:
        # A failed run (an outage: every job errored) still did its bookkeeping: count it from
        # the audit trail.
        summary.add_counts(_recorded_outcomes(res.run_id))
        return False
    for node in res.job_def.nodes:
        if node.name not in REPORT_OPS:
            continue
        out = res.output_for_node(node.name)
        summary.scanned += int(out["scanned"])
        for outcome in out["outcomes"]:
            summary.counts[outcome] += 1
    return True


def _recorded_outcomes(run_id: str) -> Counter[str]:
    from recon_dagster.defs.resources import DatabaseResource

    try:
        with DatabaseResource().get_engine().connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT outcome, count(*) AS n FROM reconcile_events WHERE run_id = :r GROUP BY outcome"
                ),
                {"r": run_id},
            )
            return Counter({r.outcome: int(r.n) for r in rows})
    except Exception:  # the report is a summary; the run itself is in the instance
        return Counter()
