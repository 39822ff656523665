"""The ``job_story`` pages' retention: each page is a ``recon_job`` dynamic partition (one per job
id, ``defs/explain/stories.py``), and Dagster keeps every partition key forever. A page goes once
its job ended past ``RECON_RETENTION_JOB_STORIES_DAYS``; never the page of a job in flight, with
credits reserved, or reconciled since (``db.retention.ended_before`` decides).

Deleting the key takes the page out of the asset's partitions (the UI lists no such job any
more); the materializations that filled it were logged by the runs that recorded them, and go
with those runs (``prune_runs``): Dagster OSS cannot wipe a single partition's events. A key
that is no job id (none is written) is never deleted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import dagster as dg
import sqlalchemy as sa

from recon_dagster.db.retention import ended_before
from recon_dagster.defs.explain.stories import PARTITIONS

PAGE = 200  # partition keys read, judged and deleted per batch


@dataclass
class StoriesReport:
    deleted: int = 0
    kept: int = 0
    batches: int = 0
    finished: bool = True

    def line(self) -> str:
        more = "" if self.finished else " (time budget used up: the next pass goes on)"
        return (
            f"deleted {self.deleted} job_story page(s) of jobs ended past retention; kept {self.kept} "
            f"in {self.batches} batch(es){more}"
        )


def _is_job_id(key: str) -> bool:
    try:
        uuid.UUID(key)
    except ValueError:
        return False
    return True


def prune_stories(
    instance: dg.DagsterInstance,
    engine: sa.Engine,
    cut: datetime,
    *,
    budget_s: float,
    page: int = PAGE,
    clock: Callable[[], float] = time.monotonic,
) -> StoriesReport:
    """Delete the ``recon_job`` partitions of jobs that ended before ``cut``, ``page`` keys at a
    time (oldest partitions first), until none is left or ``budget_s`` is spent."""
    report = StoriesReport()
    start = clock()
    cursor: str | None = None
    while True:
        if clock() - start >= budget_s:
            report.finished = False
            break
        result = instance.get_paginated_dynamic_partitions(
            PARTITIONS, limit=page, ascending=True, cursor=cursor
        )
        keys = list(result.results)
        if not keys:
            break
        report.batches += 1
        doomed = set(ended_before(engine, [k for k in keys if _is_job_id(k)], cut))
        for key in keys:
            if key in doomed:
                instance.delete_dynamic_partition(PARTITIONS, key)
                report.deleted += 1
            else:
                report.kept += 1
        if not result.has_more:
            break
        cursor = result.cursor
    return report
