"""Units of work: what the sensor plans (pure) and what a run claims when it starts.

The sensor only reads: rows in, batches with deterministic run keys out. The reconcile lease is
taken by the run itself, when it starts (``claim_at_start``), in the name of its run key. So
evaluating the sensor (a UI preview, a daemon that dies before submitting) changes no job row, and
time a run spends in Dagster's queue is never counted as an attempt.

Attempt numbers are 1-based: ``reconcile_attempts`` counts attempts that ended, so the attempt a
run makes is ``reconcile_attempts + 1``, the number in its tags, run key and log.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from recon_dagster.core.kinds import KINDS
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.jobs import Claim, JobRow
from recon_dagster.db.sqltext import sql


@dataclass(frozen=True)
class Batch:
    """One run's worth of jobs of one provider kind; ``claims`` carry the attempt each expects."""

    provider_kind: str
    claims: tuple[Claim, ...]
    run_key: str

    @property
    def job_ids(self) -> list[str]:
        return [str(c.job_id) for c in self.claims]

    @property
    def attempts(self) -> list[int]:
        return [c.attempt for c in self.claims]

    @property
    def work_key(self) -> str:
        """The run key without a retry suffix: the identity of this work (see ``with_retry``)."""
        return self.run_key.split("~", 1)[0]

    def with_retry(self, n: int) -> Batch:
        """The same work under a fresh key, for when ``n`` runs of it ended without claiming it
        (they failed before their first op): Dagster never launches a run key twice."""
        key = self.work_key if n == 0 else f"{self.work_key}~{n}"
        return Batch(self.provider_kind, self.claims, key)


def next_attempt(row: JobRow) -> int:
    """The attempt number the next run of this job makes. A lease still on the row is one a
    dead run left behind (the scan only returns expired ones): that run's attempt counts."""
    return row.reconcile_attempts + (1 if row.reconcile_lease_owner is not None else 0) + 1


def run_key_for(provider_kind: str, claims: Sequence[Claim]) -> str:
    """Deterministic identity: the same jobs at the same attempts always give the same key.

    A single job's key is ``<job id>:<attempt>``; a batch hashes its sorted members.
    """
    if len(claims) == 1:
        return f"{claims[0].job_id}:{claims[0].attempt}"
    members = ",".join(sorted(f"{c.job_id}:{c.attempt}" for c in claims))
    return f"{provider_kind}:batch:{hashlib.sha256(members.encode()).hexdigest()[:24]}"


def plan_batches(
    rows: Sequence[JobRow],
    *,
    batch_size: int,
    single_below: int,
    provider_batch_size: Mapping[str, int] | None = None,
) -> list[Batch]:
    """Group stale rows of known kinds by kind; a kind with few due jobs gets one run per job
    (each run tells one job's story in the UI), a backlog is packed into runs of ``batch_size``
    (or its provider's size in ``provider_batch_size``, lowered where its read budget binds).
    Rows of unknown or missing kind are left to the sweep (they have no partition)."""
    by_kind: dict[str, list[JobRow]] = defaultdict(list)
    for row in rows:
        if row.provider_kind is not None and row.provider_kind in KINDS:
            by_kind[row.provider_kind].append(row)
    batches: list[Batch] = []
    for kind in sorted(by_kind):
        kind_rows = by_kind[kind]
        packed = (provider_batch_size or {}).get(str(KINDS[kind].provider), batch_size)
        size = 1 if len(kind_rows) < single_below else max(1, packed)
        for i in range(0, len(kind_rows), size):
            chunk = kind_rows[i : i + size]
            planned = tuple(Claim(r.id, next_attempt(r)) for r in chunk)
            batches.append(Batch(kind, planned, run_key_for(kind, planned)))
    return batches


def within_poll_budgets(
    batches: Sequence[Batch],
    budgets: Mapping[str, int | None],
    busy: Mapping[str, int],
) -> tuple[list[Batch], list[Batch]]:
    """Split planned batches into those to request now and those that wait their turn (no run,
    no lease, no attempt): per provider, the polls already in queued or running runs (``busy``)
    plus the polls requested now stay within the provider's ``budgets`` (the polls its account
    serves in one cadence; None: no cap). Whole batches only, so a backlog is never cut into
    many small runs (each run's worker costs seconds to start).

    Batches are taken in turns, fairly across kinds: every kind's first batch, smallest first (a
    few fresh stuck jobs of one kind go before another kind's backlog), then every kind's second,
    and so on, until the next one does not fit. A provider with nothing in flight always gets its
    first batch, however small its budget, so it never stalls."""
    left = {p: None if cap is None else cap - busy.get(p, 0) for p, cap in budgets.items()}
    idle = {p for p in budgets if busy.get(p, 0) <= 0}
    full: set[str] = set()
    now: list[Batch] = []
    later: list[Batch] = []
    for batch in _in_turns(batches):
        provider = str(KINDS[batch.provider_kind].provider)
        room = left.get(provider)
        size = len(batch.claims)
        if room is None:
            now.append(batch)
        elif provider not in full and (size <= room or provider in idle):
            left[provider] = room - size
            idle.discard(provider)
            now.append(batch)
        else:
            full.add(provider)  # its later turns wait too: the order stays fair
            later.append(batch)
    return now, later


def _in_turns(batches: Sequence[Batch]) -> list[Batch]:
    """Every kind's first batch (smallest first), then every kind's second, and so on."""
    by_kind: dict[str, list[Batch]] = defaultdict(list)
    for b in batches:
        by_kind[b.provider_kind].append(b)
    turns: list[list[Batch]] = []
    for kind_batches in by_kind.values():
        for i, b in enumerate(kind_batches):
            if i == len(turns):
                turns.append([])
            turns[i].append(b)
    return [b for turn in turns for b in sorted(turn, key=lambda b: (len(b.claims), b.provider_kind))]


def claim_at_start(
    conn: sa.Connection, claims: Sequence[Claim], owner: str, ttl: timedelta, *, cap: int | None = None
) -> tuple[list[Claim], dict[uuid.UUID, str]]:
    """Take the reconcile lease for a run that is starting; returns the claims that won and the
    jobs whose claim raised (job id -> the error, one line).

    Compare-and-set on the attempt the sensor planned: a job is claimed only if the attempt it
    would now make is still ``claim.attempt`` (nobody counted one since) and it is in flight and
    unleased, leased to ``owner`` already (a re-executed run), or its lease expired. Taking over an
    expired lease counts the dead run's attempt (``reconcile_attempts + 1``, never past ``cap``), so
    the returned ``attempt`` of such a claim is the counter after the takeover plus one: a caller
    must check it against the cap. ``claim_jobs`` locks rows in id order and skips a row another
    claimer holds right now, so two claimers never deadlock and never both win.
    """
    won, errors = claim_isolated(conn, claims, owner, ttl, planned=True, cap=cap)
    return [Claim(c.job_id, c.attempt + 1) for c in won], errors


def claim_isolated(
    conn: sa.Connection,
    claims: Sequence[Claim],
    owner: str,
    ttl: timedelta,
    *,
    planned: bool,
    cap: int | None,
) -> tuple[list[Claim], dict[uuid.UUID, str]]:
    """``claim_jobs`` in one statement; if that statement raises, each job is claimed on its own
    (each in a savepoint), so a row whose claim raises keeps its error and the others are claimed.
    """
    try:
        with conn.begin_nested():
            return jobs_db.claim_jobs(conn, claims, owner, ttl, planned=planned, cap=cap), {}
    except sa.exc.DBAPIError:
        pass  # find the row(s) it chokes on
    won: list[Claim] = []
    errors: dict[uuid.UUID, str] = {}
    for claim in claims:
        try:
            with conn.begin_nested():
                won += jobs_db.claim_jobs(conn, [claim], owner, ttl, planned=planned, cap=cap)
        except sa.exc.DBAPIError as exc:
            cause = exc.orig if exc.orig is not None else exc
            errors[claim.job_id] = f"claim raised {type(cause).__name__}: {str(cause).splitlines()[0]}"
    return won, errors


def renew_leases(
    conn: sa.Connection, job_ids: Sequence[uuid.UUID], owner: str, ttl: timedelta
) -> set[uuid.UUID]:
    """Re-assert the run's lease on many jobs in one statement (before each act step); returns the
    ids still ours and in flight."""
    if not job_ids:
        return set()
    rows = conn.execute(
        sql(
            """
            UPDATE jobs SET reconcile_lease_expires_at = now() + make_interval(secs => :ttl_s)
            WHERE id = ANY(:ids) AND reconcile_lease_owner = :owner
              AND status IN ('pending', 'processing')
            RETURNING id
            """
        ).bindparams(sa.bindparam("ids", type_=pg.ARRAY(pg.UUID))),
        {"ids": [str(j) for j in job_ids], "owner": owner, "ttl_s": ttl.total_seconds()},
    )
    return {uuid.UUID(str(r.id)) for r in rows}
