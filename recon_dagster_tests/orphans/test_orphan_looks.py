"""When a lost create has been looked for, what a cancel really did, and one list's failure kept
to its own collection (issue 46, items 2, 3, 4 and 6), on real PostgreSQL and the sandbox over
HTTP."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.db import ledger, spend
from recon_dagster.providers import ProvidersResource, providers_from_env
from recon_dagster.providers.replicate.tasks import ReplicateTasks
from recon_dagster.providers.status import ProviderHTTPError
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.factories import balances, job_row, make_job, reserve
from recon_dagster_tests.support.orphans import actions, anomaly_details, recorded, sweep
from recon_dagster_tests.support.reconcile import make_defs, tick

RUNNING = Scenario(outcome="run_forever")
LATE = Scenario(polls_before_done=1)  # running at the sweep's poll, succeeded right after


@pytest.fixture
def providers(sandbox: SandboxServer) -> Iterator[ProvidersResource]:
    sandbox.reset()
    with contextlib.closing(providers_from_env()) as res:
        yield res


def unanswered(
    db: sa.Engine, job: uuid.UUID, state: ledger.CreateState, kind: str = "replicate-prediction"
) -> ledger.Create:
    with db.begin() as conn:
        intent = ledger.record_intent(
            conn, job, provider="replicate", kind=kind, fingerprint=f"fp-{uuid.uuid4()}", marker_sent=True
        )
        ledger.record_outcome(conn, intent.id, state, str(state))
    return intent


def held(db: sa.Engine, job: uuid.UUID) -> bool:
    with db.connect() as conn:
        return job in ledger.awaiting_look(conn, [job], ["replicate"], timedelta(hours=6))


def fates(db: sa.Engine, job: uuid.UUID) -> dict[str | None, str | None]:
    with db.connect() as conn:
        return {c.task_id: c.fate for c in ledger.creates_of_job(conn, job)}


# --- item 2: every unanswered create holds its job ----------------------------------------------


def test_a_refused_retry_does_not_unmask_an_earlier_lost_create(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance, media_dir: str,
) -> None:  # fmt: skip
    job = make_job(db, user, status="processing", created_minutes_ago=200)
    reserve(db, job, user, 30)
    unanswered(db, job, ledger.CreateState.AMBIGUOUS)  # the first create's answer was lost
    unanswered(db, job, ledger.CreateState.REFUSED)  # its retry: 402 / 429 / never sent

    tick(make_defs(media_dir), instance, sweep=True)
    assert job_row(db, job)["status"] == "processing"  # not refunded before the look
    assert balances(db, user) == (Decimal(70), Decimal(50))

    assert sweep(db, providers).looked == 1  # the look, which found nothing
    tick(make_defs(media_dir), instance, sweep=True)
    assert job_row(db, job)["status"] == "failed" and balances(db, user) == (Decimal(100), Decimal(50))


def test_every_unanswered_create_of_a_job_holds_it_until_each_is_looked_for(
    db: sa.Engine, user: uuid.UUID
) -> None:
    job = make_job(db, user, status="processing")
    first = unanswered(db, job, ledger.CreateState.AMBIGUOUS)
    second = unanswered(db, job, ledger.CreateState.AMBIGUOUS)
    with db.begin() as conn:
        began = ledger.look_began(conn)
        ledger.mark_looked(conn, [second.id], began)
    assert held(db, job)  # the first one is still unlooked-for
    with db.begin() as conn:
        ledger.mark_looked(conn, [first.id], ledger.look_began(conn))
    assert not held(db, job)


# --- item 3: "looked for" is the walk's start ----------------------------------------------------


def test_a_create_whose_answer_is_lost_during_the_walk_is_not_looked_for_by_it(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    for _ in range(3):
        sandbox.add_task("replicate-prediction", RUNNING)  # a walk with something to read
    job = make_job(db, user, status="processing")
    lost: list[ledger.Create] = []
    real = ReplicateTasks._list_collection

    def walk(self: Any, collection: str, after: datetime, before: datetime | None) -> Iterator[Any]:
        for n, task in enumerate(real(self, collection, after, before)):
            if collection == "predictions" and n == 0:  # mid-walk: a create is sent, its answer lost
                lost.append(unanswered(db, job, ledger.CreateState.AMBIGUOUS))
            yield task

    monkeypatch.setattr(ReplicateTasks, "_list_collection", walk)
    report = sweep(db, providers)

    assert lost and report.looked == 1  # stamped, but with the walk's start
    assert held(db, job)
    with db.connect() as conn:
        [create] = ledger.creates_of_job(conn, job)
    assert create.looked_at is not None and create.looked_at < create.state_at
    monkeypatch.setattr(ReplicateTasks, "_list_collection", real)
    sweep(db, providers)  # the next walk began after it ended
    assert not held(db, job)


def test_a_stamp_never_moves_back(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, status="processing")
    create = unanswered(db, job, ledger.CreateState.AMBIGUOUS)
    late, early = datetime.now(UTC) + timedelta(minutes=1), datetime.now(UTC) - timedelta(hours=1)
    with db.begin() as conn:
        ledger.mark_looked(conn, [create.id], late)
        ledger.mark_looked(conn, [create.id], early)
        [after] = ledger.creates_of_job(conn, job)
    assert after.looked_at == late


# --- item 6: one collection's failure is its own ------------------------------------------------


def test_a_failed_trainings_list_keeps_the_predictions_it_listed(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    ours = sandbox.add_task("replicate-prediction", RUNNING)
    ended = make_job(db, user, status="failed")
    recorded(db, ended, "replicate-prediction", ours)
    waiting = make_job(db, user, status="processing")
    lost_prediction = unanswered(db, waiting, ledger.CreateState.AMBIGUOUS, "replicate-prediction")
    waiting_training = make_job(db, user, status="processing")
    unanswered(db, waiting_training, ledger.CreateState.AMBIGUOUS, "replicate-training")
    real = ReplicateTasks._list_collection

    def walk(self: Any, collection: str, after: datetime, before: datetime | None) -> Iterator[Any]:
        if collection == "trainings":
            raise ProviderHTTPError("replicate", 503, "trainings list unavailable")
        return real(self, collection, after, before)

    monkeypatch.setattr(ReplicateTasks, "_list_collection", walk)
    report = sweep(db, providers)

    assert actions(report) == {ours: "cancel"}
    assert sandbox.task_info(ours)["canceled"] is True
    assert any("trainings" in where or "trainings" in error for where, error in report.errors.items())
    assert not held(db, waiting)  # its collection was listed whole
    assert held(db, waiting_training)  # its collection's list failed: not looked for
    assert lost_prediction.job_id == waiting


# --- item 4: what a cancel really did --------------------------------------------------------


def test_a_kie_orphan_is_cancel_refused_followed_and_billed_when_it_succeeds(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    task = sandbox.add_task("kie-standard", LATE)
    job = make_job(db, user, status="failed", provider_kind="kie-standard")
    recorded(db, job, "kie-standard", task)
    start, end = datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC) + timedelta(hours=1)

    first = sweep(db, providers)
    assert actions(first) == {task: "cancel"} and fates(db, job) == {task: "cancel_refused"}
    assert [d["task_id"] for d in anomaly_details(db, job, "orphan_running")] == [task]
    with db.connect() as conn:  # kie_spend counts it among the tasks nobody paid for
        assert (task, job) in spend.creates_without_charge(conn, "kie", start, end)

    second = sweep(db, providers)  # still followed: its end is judged like any orphan's
    assert actions(second) == {task: "orphan_billed"}
    assert fates(db, job) == {task: "orphan_billed"}
    assert [d["task_id"] for d in anomaly_details(db, job, "orphan_billed")] == [task]


def test_a_fal_cancel_answered_already_completed_is_followed_to_its_bill(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    task = sandbox.add_task("fal-image", LATE)
    job = make_job(db, user, status="failed", provider_kind="fal-image")
    recorded(db, job, "fal-image", task)

    first = sweep(db, providers)
    assert [s.done for s in first.tasks] == ["cancel: already_ended (still followed until it ends)"]
    assert fates(db, job) == {task: "already_ended"}

    second = sweep(db, providers)
    assert actions(second) == {task: "orphan_billed"} and fates(db, job) == {task: "orphan_billed"}


def test_a_cancel_answered_not_found_is_recorded_so(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from recon_dagster.providers.upstream_tasks import CancelResult

    task = sandbox.add_task("replicate-prediction", RUNNING)
    job = make_job(db, user, status="failed")
    recorded(db, job, "replicate-prediction", task)
    monkeypatch.setattr(ReplicateTasks, "cancel_task", lambda self, c, t: CancelResult.NOT_FOUND)

    sweep(db, providers)

    assert fates(db, job) == {task: "not_found"}
