"""The orphan sweep's two promises over random interleavings (issue 46), on real PostgreSQL: creates
answered, lost (the task made or not), left sending by a dead worker, refused; an app that names
its task only on the job row; another system on the same key asking the very same thing; list
walks with things happening between their pages; orphan sweeps and stale sweeps in any order.

1. No task outside the create ledger, our echoed marker or a job row is ever cancelled or adopted.
2. No job with an unanswered create is refunded (failed by the stale sweep) before a list walk
   that began after that create ended.

The provider is an in-process fake (``FakeReplicate``) so the test owns the interleaving between
list pages; everything else (the ledger, the job rows, ``awaiting_look``, the sweep) is the real
code on the real database.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recon_dagster.db import ledger
from recon_dagster.providers.upstream_tasks import CancelResult, TaskPhase, UpstreamTask
from recon_dagster.reconcile.orphan_sweep import SweepPolicy, sweep_orphans
from recon_dagster_tests.support.factories import make_job

KIND = "replicate-prediction"
PAGE = 2
WAIT = timedelta(hours=6)
POLICY = SweepPolicy(window=timedelta(hours=6), grace=timedelta(0), act=True, shadowed=lambda kind: False)


@dataclass
class Listed:
    task_id: str
    asked: dict[str, Any]
    marker: str | None
    created_at: datetime
    phase: TaskPhase = TaskPhase.RUNNING
    canceled: bool = False


@dataclass
class FakeReplicate:
    """A provider that lists newest first, ``PAGE`` a page, showing only tasks made before the
    walk's first page; ``between_pages`` runs after each page is read."""

    db: sa.Engine
    tasks: list[Listed] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    walks: list[datetime] = field(default_factory=list)  # the DB clock at each walk's first page
    between_pages: list[Any] = field(default_factory=list)
    cancel_answers: Iterator[CancelResult] = field(
        default_factory=lambda: itertools.cycle([CancelResult.CANCELLED])
    )

    def task_collections(self) -> Mapping[str, frozenset[str]]:
        return {"predictions": frozenset({KIND})}

    def list_collection(
        self, collection: str, *, created_after: datetime, created_before: datetime | None = None
    ) -> Iterator[UpstreamTask]:
        with self.db.connect() as conn:
            self.walks.append(conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one())
        shown = sorted((t for t in self.tasks if t.created_at >= created_after), key=lambda t: t.created_at,
                       reverse=True)  # fmt: skip
        pages = [shown[i : i + PAGE] for i in range(0, len(shown), PAGE)] or [[]]  # one page, maybe empty
        for page in pages:
            for t in page:
                yield UpstreamTask(
                    "replicate", t.task_id, collection, t.phase, t.phase.value, t.created_at,
                    marker=t.marker, kind=KIND, fingerprint=ledger.fingerprint({"input": t.asked}),
                )  # fmt: skip
            while self.between_pages:
                self.between_pages.pop(0)()

    def list_tasks(
        self, *, created_after: datetime, created_before: datetime | None = None
    ) -> Iterator[UpstreamTask]:
        return self.list_collection("predictions", created_after=created_after, created_before=created_before)

    def cancel_task(self, collection: str, task_id: str) -> CancelResult:
        self.cancels.append(task_id)
        for t in self.tasks:
            if t.task_id == task_id:
                t.canceled, t.phase = True, TaskPhase.ENDED
        return next(self.cancel_answers)


@dataclass
class World:
    db: sa.Engine
    user: uuid.UUID
    fake: FakeReplicate
    jobs: list[uuid.UUID]
    provable: set[str] = field(default_factory=set)  # ledger task id, echoed marker, or job row
    unprovable: set[str] = field(default_factory=set)  # a lost create's unmarked task; another system's
    n: itertools.count = field(default_factory=itertools.count)

    def asked(self, j: int) -> dict[str, Any]:
        return {"prompt": f"job {j % len(self.jobs)}"}

    def new_task(self, asked: dict[str, Any], marker: str | None) -> Listed:
        task = Listed(f"t{next(self.n)}", asked, marker, datetime.now(UTC))
        self.fake.tasks.append(task)
        return task

    def create(self, j: int, outcome: str, echo: bool) -> None:
        job = self.jobs[j % len(self.jobs)]
        with self.db.begin() as conn:
            intent = ledger.record_intent(conn, job, provider="replicate", kind=KIND,
                                          fingerprint=ledger.fingerprint({"input": self.asked(j)}), marker_sent=True)  # fmt: skip
        if outcome == "refused":
            with self.db.begin() as conn:
                ledger.record_outcome(conn, intent.id, ledger.CreateState.REFUSED, "402")
            return
        arrived = outcome != "lost_before_arrival"
        if arrived:
            task = self.new_task(self.asked(j), intent.marker if echo else None)
            (self.provable if echo or outcome == "answered" else self.unprovable).add(task.task_id)
        if outcome == "answered":
            with self.db.begin() as conn:
                ledger.record_task(
                    conn, job, provider="replicate", kind=KIND, task_id=task.task_id, create=intent.id
                )
        elif outcome in ("lost", "lost_before_arrival"):
            with self.db.begin() as conn:
                ledger.record_outcome(conn, intent.id, ledger.CreateState.AMBIGUOUS, "answer lost")
        # "died": the worker died before any answer: the create stays sending

    def row_only(self, j: int) -> None:
        """An app that writes the task id on its row (the spec's contract) and not the ledger."""
        job = self.jobs[j % len(self.jobs)]
        task = self.new_task(self.asked(j), None)
        with self.db.begin() as conn:
            named = conn.execute(
                sa.text("UPDATE jobs SET provider_task_id = :t WHERE id = :j AND provider_task_id IS NULL "
                        "AND status IN ('pending', 'processing') RETURNING id"),
                {"t": task.task_id, "j": str(job)},
            ).first()  # fmt: skip
        (self.provable if named else self.unprovable).add(task.task_id)

    def foreign(self, j: int) -> None:
        """Another system on our key, asking exactly what one of our jobs asked."""
        self.unprovable.add(self.new_task(self.asked(j), None).task_id)

    def settle(self, j: int, succeeded: bool) -> None:
        for t in self.fake.tasks:
            if t.phase is TaskPhase.RUNNING and int(t.task_id[1:]) % len(self.jobs) == j % len(self.jobs):
                t.phase = TaskPhase.SUCCEEDED if succeeded else TaskPhase.ENDED
                return

    def sweep(self, mid_walk: list[tuple[int, str, bool]]) -> None:
        self.fake.between_pages.extend((lambda j=j, o=o, e=e: self.create(j, o, e)) for j, o, e in mid_walk)
        sweep_orphans(self.db, SimpleNamespace(replicate=self.fake), POLICY)
        self.fake.between_pages.clear()

    def stale_sweep(self) -> None:
        """What the stale sweep does, reduced to the rule under test: an in-flight job not held by
        ``awaiting_look`` is failed and refunded."""
        with self.db.begin() as conn:
            inflight = [
                uuid.UUID(str(r)) for r in conn.execute(
                    sa.text("SELECT id FROM jobs WHERE status IN ('pending', 'processing') AND id = ANY(:ids)"),
                    {"ids": [str(j) for j in self.jobs]},
                ).scalars()
            ]  # fmt: skip
            held = ledger.awaiting_look(conn, inflight, ["replicate"], WAIT)
            for job in inflight:
                if job in held:
                    continue
                for c in ledger.creates_of_job(conn, job):
                    if c.task_id is None and c.fate is None and c.state in ("sending", "ambiguous"):
                        # Promise 2: a walk began after this create ended.
                        assert any(w >= c.state_at for w in self.fake.walks), (
                            f"job {job} refunded with create {c.seq} ({c.state} at {c.state_at}) "
                            f"never looked for by a walk that began after it; walks: {self.fake.walks}"
                        )
                conn.execute(sa.text("UPDATE jobs SET status = 'failed' WHERE id = :j"), {"j": str(job)})

    def check_nothing_unprovable_touched(self) -> None:
        """Promise 1: no cancel, no adoption of a task without proof."""
        touched = set(self.fake.cancels) & self.unprovable
        assert not touched, f"cancelled without proof: {touched}"
        with self.db.connect() as conn:
            named = set(
                conn.execute(
                    sa.text("SELECT provider_task_id FROM jobs WHERE provider_task_id IS NOT NULL")
                ).scalars()
            )
        assert not named & self.unprovable, f"adopted without proof: {named & self.unprovable}"


OUTCOMES = st.sampled_from(["answered", "lost", "lost_before_arrival", "died", "refused"])
JOB = st.integers(min_value=0, max_value=1)
STEP = st.one_of(
    st.tuples(st.just("create"), JOB, OUTCOMES, st.booleans()),
    st.tuples(st.just("row_only"), JOB),
    st.tuples(st.just("foreign"), JOB),
    st.tuples(st.just("settle"), JOB, st.booleans()),
    st.tuples(st.just("end"), JOB, st.sampled_from(["failed", "completed", "cancelled"])),
    st.tuples(st.just("sweep"), st.lists(st.tuples(JOB, OUTCOMES, st.booleans()), max_size=3)),
    st.tuples(
        st.just("stale"),
    ),
)
TABLES = "jobs, upstream_creates, credit_anomalies, recon_credit_anomaly_keys, reconcile_decisions, reconcile_events"


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(STEP, min_size=1, max_size=25),
    cancel_answers=st.lists(st.sampled_from(list(CancelResult)), min_size=1, max_size=4),
)
def test_only_provable_tasks_are_acted_on_and_no_lost_create_is_refunded_before_its_look(
    db: sa.Engine, user: uuid.UUID, steps: list[tuple[Any, ...]], cancel_answers: list[CancelResult]
) -> None:
    with db.begin() as conn:
        conn.exec_driver_sql(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")
    fake = FakeReplicate(db, cancel_answers=itertools.cycle(cancel_answers))
    jobs = [
        make_job(db, user, status="processing", provider_kind=KIND, created_minutes_ago=200) for _ in range(3)
    ]
    world = World(db, user, fake, jobs)
    for step in steps:
        match step:
            case ("create", j, outcome, echo):
                world.create(j, outcome, echo)
            case ("row_only", j):
                world.row_only(j)
            case ("foreign", j):
                world.foreign(j)
            case ("settle", j, succeeded):
                world.settle(j, succeeded)
            case ("end", j, status):
                with db.begin() as conn:
                    conn.execute(sa.text("UPDATE jobs SET status = :s WHERE id = :j"),
                                 {"s": status, "j": str(jobs[j % len(jobs)])})  # fmt: skip
            case ("sweep", mid_walk):
                world.sweep(mid_walk)
            case ("stale",):
                world.stale_sweep()
        world.check_nothing_unprovable_touched()
    world.sweep([])
    world.stale_sweep()
    world.check_nothing_unprovable_touched()
