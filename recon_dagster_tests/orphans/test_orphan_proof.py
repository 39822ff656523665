"""Only what is provably ours is cancelled or adopted (issue 46, items 1 and 5), on real PostgreSQL
and the sandbox over HTTP: a task that only resembles a lost create of ours (same input, same
minutes) is ``probably_ours`` and left alone until the operator says; a task a job row names is
ours even when the ledger never heard of it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa

from recon_dagster.cli.commands import main
from recon_dagster.config import Settings
from recon_dagster.db import ledger
from recon_dagster.providers import ProvidersResource, providers_from_env
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.factories import job_row, make_job
from recon_dagster_tests.support.orphans import actions, anomaly_details, snapshot, sweep

RUNNING = Scenario(outcome="run_forever")
DONE = Scenario(polls_before_done=0)
PROMPT = {"prompt": "a lighthouse at dusk", "seed": 7}


@pytest.fixture
def providers(sandbox: SandboxServer) -> Iterator[ProvidersResource]:
    sandbox.reset()
    with contextlib.closing(providers_from_env()) as res:
        yield res


def lost_create(db: sa.Engine, job: uuid.UUID, kind: str = "replicate-prediction") -> ledger.Create:
    """A create of ``job`` whose answer was lost (ambiguous), asking for ``PROMPT``."""
    with db.begin() as conn:
        intent = ledger.record_intent(
            conn, job, provider="replicate", kind=kind,
            fingerprint=ledger.fingerprint({"input": PROMPT}), marker_sent=True,
        )  # fmt: skip
        ledger.record_outcome(conn, intent.id, ledger.CreateState.AMBIGUOUS, "answer lost")
    return intent


def lookalike(sandbox: SandboxServer, scenario: Scenario = RUNNING) -> str:
    """Another system's prediction, on the same key, asking exactly what ours asked."""
    return sandbox.sandbox.state.add_task("replicate-prediction", scenario, input=dict(PROMPT)).task_id


def held(db: sa.Engine, job: uuid.UUID) -> bool:
    with db.connect() as conn:
        return job in ledger.awaiting_look(conn, [job], ["replicate"], timedelta(hours=6))


def written(db: sa.Engine) -> dict[str, str]:
    """What an action writes (the provider limiter's rows move with any request, a list's too)."""
    return {t: d for t, d in snapshot(db).items() if not t.startswith("provider_limit")}


def events(db: sa.Engine, job: uuid.UUID) -> list[tuple[str, str]]:
    with db.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT outcome, detail FROM reconcile_events WHERE job_id = :j ORDER BY id"),
            {"j": str(job)},
        ).all()
    return [(r.outcome, r.detail) for r in rows]


@pytest.mark.parametrize("job_status", ["failed", "cancelled", "completed"])
def test_a_lookalike_of_a_lost_create_whose_job_ended_is_probably_ours_and_never_cancelled(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID, job_status: str
) -> None:
    job = make_job(db, user, status=job_status)
    lost_create(db, job)
    other = lookalike(sandbox)

    report = sweep(db, providers)

    assert actions(report) == {other: "probably_ours"}
    [swept] = report.tasks
    assert swept.verdict.job_id == job and str(job) in swept.verdict.reason  # the create it resembles
    assert sandbox.task_info(other)["canceled"] is False
    with db.connect() as conn:
        assert [c.task_id for c in ledger.creates_of_job(conn, job)] == [None]  # nothing claimed


def test_a_lookalike_of_a_lost_create_whose_job_is_in_flight_is_never_adopted_and_the_job_waits(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    job = make_job(db, user, status="processing", created_minutes_ago=200)
    lost_create(db, job)
    other = lookalike(sandbox, DONE)

    report = sweep(db, providers)

    assert actions(report) == {other: "probably_ours"}
    assert job_row(db, job)["provider_task_id"] is None
    assert held(db, job)  # the look found a candidate: the stale sweep must not refund it yet


def test_the_operator_adopts_a_probably_ours_task_onto_its_job_recorded_with_who_and_why(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv(Settings.operator.name, "alice")
    job = make_job(db, user, status="processing", provider_kind="replicate-prediction")
    create = lost_create(db, job)
    task = lookalike(sandbox)

    assert main(["orphans", "--adopt", task, "--job", str(job), "--reason", "same prompt, our logs"]) == 0

    assert "adopt" in capsys.readouterr().out
    assert job_row(db, job)["provider_task_id"] == task
    with db.connect() as conn:
        [after] = ledger.creates_of_job(conn, job)
    assert (after.id, after.task_id, after.fate) == (create.id, task, "adopted")
    assert after.fate_detail["by"] == "alice"
    [(outcome, detail)] = events(db, job)
    assert outcome == "operator_adopt" and "alice" in detail and task in detail
    assert actions(sweep(db, providers)) == {task: "owned"}  # provably ours from now on


def test_the_operator_cancels_a_probably_ours_task_and_the_cancel_is_recorded(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv(Settings.operator.name, "bob")
    job = make_job(db, user, status="failed", provider_kind="replicate-prediction")
    lost_create(db, job)
    task = lookalike(sandbox)

    assert main(["orphans", "--cancel", task]) == 0

    assert sandbox.task_info(task)["canceled"] is True
    with db.connect() as conn:
        [after] = ledger.creates_of_job(conn, job)
    assert (after.task_id, after.fate, after.fate_detail["by"]) == (task, "cancelled", "bob")
    [(outcome, detail)] = events(db, job)
    assert outcome == "operator_cancel" and "bob" in detail


@pytest.mark.parametrize("what", ["adopt", "cancel"])
def test_the_operator_cannot_adopt_or_cancel_another_systems_task(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    capsys: pytest.CaptureFixture[str], what: str,
) -> None:  # fmt: skip
    job = make_job(db, user, status="processing", provider_kind="replicate-prediction")
    stranger = sandbox.add_task("replicate-prediction", RUNNING)  # resembles nothing of ours
    before = written(db)

    args = ["--adopt", stranger, "--job", str(job)] if what == "adopt" else ["--cancel", stranger]
    assert main(["orphans", *args]) != 0

    assert "unknown" in capsys.readouterr().err
    assert written(db) == before
    assert sandbox.task_info(stranger)["canceled"] is False


# --- item 5: the job row is ownership -----------------------------------------------------------


@pytest.mark.parametrize("status", ["processing", "pending", "completed"])
def test_a_task_a_job_row_names_is_owned_without_any_ledger_row(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID, status: str
) -> None:
    task = sandbox.add_task("replicate-prediction", RUNNING)
    make_job(db, user, status=status, provider_kind="replicate-prediction", provider_task_id=task,
             started_minutes_ago=1)  # fmt: skip

    report = sweep(db, providers)

    assert actions(report) == {task: "owned"}
    assert sandbox.task_info(task)["canceled"] is False


@pytest.mark.parametrize(
    ("scenario", "expected"), [(RUNNING, "cancel"), (DONE, "orphan_billed")], ids=["running", "succeeded"]
)
def test_a_task_a_job_row_names_is_an_orphan_once_its_job_failed(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    scenario: Scenario, expected: str,
) -> None:  # fmt: skip
    task = sandbox.add_task("replicate-prediction", scenario)
    job = make_job(db, user, status="failed", provider_kind="replicate-prediction", provider_task_id=task)

    report = sweep(db, providers)

    assert actions(report) == {task: expected}
    assert sandbox.task_info(task)["canceled"] is (expected == "cancel")
    if expected == "orphan_billed":
        [details] = anomaly_details(db, job, "orphan_billed")
        assert details["task_id"] == task
    with db.connect() as conn:
        [create] = ledger.creates_of_job(conn, job)
    assert (create.task_id, create.fate) == (task, "cancelled" if expected == "cancel" else expected)


@pytest.mark.parametrize(
    "args",
    [["--adopt", "t1"], ["--cancel", "t1", "--job", "j"], ["--adopt", "t1", "--cancel", "t2", "--job", "j"],
     ["--cancel", "t1", "--act"]],
    ids=["adopt-without-job", "cancel-with-job", "both", "with-act"],
)  # fmt: skip
def test_a_hand_action_asked_wrongly_is_one_line_and_writes_nothing(
    db: sa.Engine, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    before = written(db)

    assert main(["orphans", *args]) == 2

    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("recon-dagster orphans:")
    assert written(db) == before
