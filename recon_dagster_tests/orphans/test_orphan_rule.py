"""The orphan rule (``reconcile.orphans.reconcile``) over every job status, task phase and age:
pure, no database."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from recon_dagster.core.types import INFLIGHT_STATUSES, TERMINAL_STATUSES, JobRow
from recon_dagster.db.ledger import Create, fingerprint
from recon_dagster.providers.upstream_tasks import TaskPhase, UpstreamTask
from recon_dagster.reconcile.orphans import ACTING, OrphanAction, match_unanswered, reconcile, resembles

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
GRACE = timedelta(minutes=2)
JOB = uuid.uuid4()


def task(
    phase: TaskPhase, *, age: timedelta = timedelta(minutes=30), task_id: str = "t1", fp: str | None = None
) -> UpstreamTask:
    return UpstreamTask("replicate", task_id, "predictions", phase, phase.value, NOW - age, fingerprint=fp)


def create(
    *, task_id: str | None = "t1", intent_age: timedelta = timedelta(minutes=30), fp: str = "fp"
) -> Create:
    at = NOW - intent_age
    return Create(uuid.uuid4(), JOB, 1, "replicate", "replicate-prediction", f"{JOB}.1", True, fp, at,
                  "created" if task_id else "ambiguous", at, task_id, at if task_id else None, None, None)  # fmt: skip


def job(status: str, task_id: str | None = None) -> JobRow:
    return JobRow(JOB, status, uuid.uuid4(), "image", "replicate-prediction", task_id, None, 0, None, None,
                  None, None, None, None, None, 0, None, None)  # fmt: skip


def act(t: UpstreamTask, c: Create | None, j: JobRow | None) -> OrphanAction:
    return reconcile(t, c, j, now=NOW, grace=GRACE).action


@pytest.mark.parametrize("phase", list(TaskPhase))
@pytest.mark.parametrize("status", [*INFLIGHT_STATUSES, *TERMINAL_STATUSES, None])
def test_a_task_not_in_the_ledger_is_unknown_whatever_else(phase: TaskPhase, status: str | None) -> None:
    assert act(task(phase), None, job(status) if status else None) is OrphanAction.UNKNOWN


@pytest.mark.parametrize("phase", list(TaskPhase))
@pytest.mark.parametrize("status", [*INFLIGHT_STATUSES, "completed"])
@pytest.mark.parametrize("in_ledger", [True, False], ids=["ledger", "row-only"])
def test_a_task_its_job_names_is_owned_while_the_job_is_in_flight_or_completed(
    phase: TaskPhase, status: str, in_ledger: bool
) -> None:
    assert act(task(phase), create() if in_ledger else None, job(status, "t1")) is OrphanAction.OWNED


@pytest.mark.parametrize(
    ("phase", "expected"),
    [(TaskPhase.RUNNING, OrphanAction.CANCEL), (TaskPhase.SUCCEEDED, OrphanAction.ORPHAN_BILLED),
     (TaskPhase.ENDED, OrphanAction.ENDED)],
)  # fmt: skip
@pytest.mark.parametrize("status", ["failed", "cancelled"])
@pytest.mark.parametrize("in_ledger", [True, False], ids=["ledger", "row-only"])
def test_a_task_its_job_names_is_an_orphan_once_the_job_failed_or_was_cancelled(
    phase: TaskPhase, expected: OrphanAction, status: str, in_ledger: bool
) -> None:
    verdict = reconcile(task(phase), create() if in_ledger else None, job(status, "t1"), now=NOW, grace=GRACE)
    assert (verdict.action, verdict.job_id) == (expected, JOB)


@pytest.mark.parametrize("phase", list(TaskPhase))
@pytest.mark.parametrize("status", [*INFLIGHT_STATUSES, *TERMINAL_STATUSES, None])
def test_a_resemblance_is_probably_ours_and_never_an_action(phase: TaskPhase, status: str | None) -> None:
    lost = create(task_id=None)
    verdict = resembles(task(phase), lost, job(status) if status else None)
    assert verdict.action is OrphanAction.PROBABLY_OURS and verdict.action not in ACTING
    assert (verdict.job_id, verdict.create) == (JOB, lost)
    assert "--adopt t1" in verdict.reason and "--cancel t1" in verdict.reason


@pytest.mark.parametrize(
    ("phase", "expected"),
    [(TaskPhase.RUNNING, OrphanAction.CANCEL), (TaskPhase.SUCCEEDED, OrphanAction.ORPHAN_BILLED),
     (TaskPhase.ENDED, OrphanAction.ENDED)],
)  # fmt: skip
@pytest.mark.parametrize("owner", [*TERMINAL_STATUSES, "gone", "in flight with another task"])
@pytest.mark.parametrize("age", [timedelta(seconds=1), timedelta(hours=3)], ids=["young", "old"])
def test_ours_nobody_will_collect(
    phase: TaskPhase, expected: OrphanAction, owner: str, age: timedelta
) -> None:
    row = (
        None if owner == "gone" else job("processing", "t0") if owner.startswith("in flight") else job(owner)
    )
    young_next_to_inflight = row is not None and row.inflight and age < GRACE
    want = OrphanAction.WAIT if young_next_to_inflight else expected
    assert act(task(phase, age=age), create(), row) is want


@pytest.mark.parametrize("status", INFLIGHT_STATUSES)
@pytest.mark.parametrize(
    ("phase", "expected"),
    [(TaskPhase.RUNNING, OrphanAction.ADOPT), (TaskPhase.SUCCEEDED, OrphanAction.ADOPT),
     (TaskPhase.ENDED, OrphanAction.ENDED)],
)  # fmt: skip
def test_a_job_in_flight_without_a_task_id_adopts_its_task_past_the_grace(
    status: str, phase: TaskPhase, expected: OrphanAction
) -> None:
    assert act(task(phase), create(), job(status)) is expected
    assert act(task(phase, age=timedelta(seconds=30)), create(), job(status)) is OrphanAction.WAIT


def test_an_unanswered_create_matches_the_nearest_task_with_its_fingerprint_in_its_window() -> None:
    fp = fingerprint({"input": {"prompt": "x"}})
    lost = replace(create(task_id=None, intent_age=timedelta(minutes=30), fp=fp))
    tasks = [
        task(TaskPhase.RUNNING, age=timedelta(minutes=29), task_id="near", fp=fp),
        task(TaskPhase.RUNNING, age=timedelta(minutes=25), task_id="later", fp=fp),
        task(TaskPhase.RUNNING, age=timedelta(minutes=29), task_id="other-input", fp="nope"),
        task(TaskPhase.RUNNING, age=timedelta(minutes=45), task_id="before-the-create", fp=fp),
    ]

    assert {t: c.id for t, c in match_unanswered(tasks, [lost], timedelta(minutes=10)).items()} == {
        "near": lost.id
    }
    assert match_unanswered(tasks, [replace(lost, fingerprint="")], timedelta(minutes=10)) == {}
