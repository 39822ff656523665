"""Our Dagster run history past its age, removed through the instance API (Dagster OSS keeps every
run, with its event log, forever; its ``retention:`` settings cover sensor and schedule ticks only).

Only finished runs of this code location's jobs go: a run whose job is not one of ours, or whose
repository label (Dagster's hidden ``.dagster/repository`` tag, ``<repository>@<location>``, on
every run launched from a code location) names another location, is never touched, so an instance
whose storage other code locations share loses none of their runs. A run that failed, or that
succeeded but tagged itself with what its end says about money or blame (``recon/outcome``: a
force-fail refund at the attempt cap, an outage), is kept ``failed_days`` instead of ``days``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import dagster as dg

from recon_dagster.core.runtags import OUTCOME_TAG

REPOSITORY_LABEL_TAG = ".dagster/repository"
PAGE = 100
DONE = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.CANCELED]
FAILED = [dg.DagsterRunStatus.FAILURE]


@dataclass
class RunsReport:
    deleted: int = 0
    kept_other_location: int = 0
    kept_outcome: int = 0
    finished: bool = True
    sample: list[str] = field(default_factory=list)

    def line(self) -> str:
        more = "" if self.finished else " (batch limit reached: the next pass goes on)"
        return (
            f"deleted {self.deleted} run(s) of ours past retention; kept {self.kept_outcome} with a "
            f"recon/outcome tag and {self.kept_other_location} of another code location{more}"
        )


def prune_runs(
    instance: dg.DagsterInstance,
    job_names: Collection[str],
    *,
    now: datetime,
    days: float,
    failed_days: float,
    our_label: str | None,
    max_runs: int,
    skip: Collection[str] = (),
) -> RunsReport:
    """Delete at most ``max_runs`` finished runs of ``job_names`` past their age; see the module."""
    report = RunsReport()
    failed_days = max(failed_days, days)
    plans = (
        (DONE, now - timedelta(days=days)),
        (FAILED, now - timedelta(days=failed_days)),
    )
    keep_outcome_before = now - timedelta(days=failed_days)
    doomed: list[str] = []
    # Page through first, delete after: the paging cursor is a run id, which must still exist.
    for name in sorted(job_names):
        for statuses, before in plans:
            cursor: str | None = None
            while len(doomed) < max_runs:
                records = instance.get_run_records(
                    filters=dg.RunsFilter(job_name=name, statuses=statuses, updated_before=before),
                    limit=PAGE,
                    cursor=cursor,
                )
                for record in records:
                    run = record.dagster_run
                    label = run.tags.get(REPOSITORY_LABEL_TAG)
                    if run.run_id in skip:
                        continue
                    if our_label and label and label != our_label:
                        report.kept_other_location += 1
                        continue
                    updated = record.update_timestamp
                    updated = updated if updated.tzinfo else updated.replace(tzinfo=UTC)
                    if OUTCOME_TAG in run.tags and updated >= keep_outcome_before:
                        report.kept_outcome += 1
                        continue
                    if len(doomed) >= max_runs:
                        report.finished = False
                        break
                    doomed.append(run.run_id)
                if len(records) < PAGE:
                    break
                cursor = records[-1].dagster_run.run_id
            if len(doomed) >= max_runs:
                report.finished = False
    for run_id in doomed:
        instance.delete_run(run_id)
        report.deleted += 1
    report.sample = doomed[:10]
    return report
