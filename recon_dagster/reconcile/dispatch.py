"""Turning a stale scan into leased units of work (what the sensor emits as runs).

The plan is pure: rows in, batches with deterministic run keys out. ``dispatch`` then takes the
reconcile lease on each batch's jobs in the name of that run key, so a job is never handed to two
runs at once, however often the sensor ticks while a run waits in the queue.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.jobs import Claim, JobRow
from recon_dagster.kinds import KINDS


@dataclass(frozen=True)
class Batch:
    """One run's worth of jobs of one provider kind."""

    provider_kind: str
    claims: tuple[Claim, ...]
    run_key: str

    @property
    def job_ids(self) -> list[str]:
        return [str(c.job_id) for c in self.claims]


def next_attempt(row: JobRow) -> int:
    """The attempt number a claim will carry: taking over an expired lease counts one attempt."""
    return row.reconcile_attempts + (1 if row.reconcile_lease_owner is not None else 0)


def run_key_for(provider_kind: str, claims: Sequence[Claim]) -> str:
    """Deterministic identity: the same jobs at the same attempts always give the same key.

    A single job's key is ``<job id>:<attempt>``; a batch hashes its sorted members.
    """
    if len(claims) == 1:
        return f"{claims[0].job_id}:{claims[0].attempt}"
    members = ",".join(sorted(f"{c.job_id}:{c.attempt}" for c in claims))
    return f"{provider_kind}:batch:{hashlib.sha256(members.encode()).hexdigest()[:24]}"


def plan_batches(rows: Sequence[JobRow], *, batch_size: int, single_below: int) -> list[Batch]:
    """Group stale rows of known kinds by kind; a kind with few due jobs gets one run per job
    (each run tells one job's story in the UI), a backlog is packed into runs of ``batch_size``.
    Rows of unknown or missing kind are left to the sweep (they have no partition)."""
    by_kind: dict[str, list[JobRow]] = defaultdict(list)
    for row in rows:
        if row.provider_kind in KINDS:
            by_kind[row.provider_kind].append(row)
    batches: list[Batch] = []
    for kind in sorted(by_kind):
        kind_rows = by_kind[kind]
        size = 1 if len(kind_rows) < single_below else max(1, batch_size)
        for i in range(0, len(kind_rows), size):
            chunk = kind_rows[i : i + size]
            planned = tuple(Claim(r.id, next_attempt(r)) for r in chunk)
            batches.append(Batch(kind, planned, run_key_for(kind, planned)))
    return batches


def dispatch(
    conn: sa.Connection, rows: Sequence[JobRow], batches: Sequence[Batch], *, lease_ttl: timedelta
) -> list[Batch]:
    """Lease every planned batch to its run key; return the batches with the jobs actually won."""
    seen = {r.id: r.reconcile_attempts for r in rows}
    out: list[Batch] = []
    for batch in batches:
        expected = [Claim(c.job_id, seen[c.job_id]) for c in batch.claims]
        won = jobs_db.claim_jobs(conn, expected, batch.run_key, lease_ttl)
        if won:
            out.append(Batch(batch.provider_kind, tuple(won), batch.run_key))
    return out
