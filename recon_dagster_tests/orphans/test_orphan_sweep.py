"""The orphan sweep over HTTP to the sandbox and real PostgreSQL: ours cancelled, adopted or
reported, unknown tasks left alone, nothing written without --act, shadow only records."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from decimal import Decimal

import pytest
import sqlalchemy as sa

from recon_dagster.cli.commands import main
from recon_dagster.config import Settings
from recon_dagster.db import ledger
from recon_dagster.providers import ProvidersResource, providers_from_env
from recon_dagster.reconcile import app_worker as worker
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.factories import balances, job_row, make_job, reserve
from recon_dagster_tests.support.orphans import actions, anomaly_details, recorded, snapshot, sweep

RUNNING = Scenario(outcome="run_forever")
DONE = Scenario(polls_before_done=0)


@pytest.fixture
def providers(sandbox: SandboxServer) -> Iterator[ProvidersResource]:
    sandbox.reset()
    with contextlib.closing(providers_from_env()) as res:
        yield res


def fates(db: sa.Engine, job: uuid.UUID) -> dict[str | None, str | None]:
    with db.connect() as conn:
        return {c.task_id: c.fate for c in ledger.creates_of_job(conn, job)}


@pytest.mark.parametrize("kind", ["replicate-prediction", "replicate-training", "elevenlabs-async"])
@pytest.mark.parametrize("job_status", ["failed", "completed", "cancelled"])
def test_only_ours_is_cancelled_next_to_an_unknown_task(
    db: sa.Engine,
    sandbox: SandboxServer,
    providers: ProvidersResource,
    user: uuid.UUID,
    kind: str,
    job_status: str,
) -> None:
    ours, unknown = sandbox.add_task(kind, RUNNING), sandbox.add_task(kind, RUNNING)
    job = make_job(db, user, status=job_status)
    recorded(db, job, kind, ours)

    report = sweep(db, providers)

    assert actions(report) == {ours: "cancel", unknown: "unknown"}
    assert sandbox.task_info(ours)["canceled"] is True
    assert sandbox.task_info(unknown)["canceled"] is False
    assert fates(db, job) == {ours: "cancelled"}


def test_a_dub_carrying_our_marker_is_ours_without_a_task_id_in_the_ledger(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    job = make_job(db, user, status="failed")
    with db.begin() as conn:
        intent = ledger.record_intent(
            conn, job, provider="elevenlabs", kind="elevenlabs-async", fingerprint="f", marker_sent=True
        )
    task = sandbox.sandbox.state.add_task(
        "elevenlabs-async", RUNNING, meta={"name": f"recon {intent.marker}"}
    )

    report = sweep(db, providers)

    assert actions(report) == {task.task_id: "cancel"}
    assert fates(db, job) == {task.task_id: "cancelled"}  # the task id is the ledger's now


def test_ours_that_succeeded_after_its_job_ended_is_an_orphan_billed_anomaly_with_its_cost(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    task = sandbox.add_task("replicate-prediction", DONE)
    job = make_job(db, user, status="failed")
    recorded(db, job, "replicate-prediction", task)

    first, again = sweep(db, providers), sweep(db, providers)

    assert actions(first) == {task: "orphan_billed"}
    [details] = anomaly_details(db, job, "orphan_billed")
    assert details["task_id"] == task and "predict_time" in details["cost"]
    assert actions(again) == {task: "orphan_billed"} and len(anomaly_details(db, job, "orphan_billed")) == 1
    assert fates(db, job) == {task: "orphan_billed"}


def test_a_task_its_job_names_is_left_to_the_reconciler(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    task = sandbox.add_task("replicate-prediction", RUNNING)
    job = make_job(
        db, user, provider_kind="replicate-prediction", provider_task_id=task, started_minutes_ago=1
    )
    recorded(db, job, "replicate-prediction", task)

    report = sweep(db, providers)

    assert actions(report) == {task: "owned"}
    assert sandbox.task_info(task)["canceled"] is False
    assert fates(db, job) == {task: "attached"}


def test_a_young_task_of_a_job_in_flight_is_left_to_its_worker(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    task = sandbox.add_task("replicate-prediction", RUNNING)
    job = make_job(db, user, status="processing")
    recorded(db, job, "replicate-prediction", task)

    report = sweep(db, providers, grace_s=600)

    assert actions(report) == {task: "wait"}
    assert job_row(db, job)["provider_task_id"] is None


def test_a_duplicate_next_to_the_task_its_job_names_is_cancelled(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    named, duplicate = (
        sandbox.add_task("replicate-prediction", RUNNING),
        sandbox.add_task("replicate-prediction", RUNNING),
    )
    job = make_job(
        db, user, provider_kind="replicate-prediction", provider_task_id=named, started_minutes_ago=1
    )
    recorded(db, job, "replicate-prediction", named)
    recorded(db, job, "replicate-prediction", duplicate)

    report = sweep(db, providers)

    assert actions(report) == {named: "owned", duplicate: "cancel"}
    assert (sandbox.task_info(named)["canceled"], sandbox.task_info(duplicate)["canceled"]) == (False, True)


@pytest.mark.parametrize("state", [DONE, RUNNING], ids=["succeeded", "running"])
def test_kie_has_no_list_the_ledgers_second_task_is_found_and_polled(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID, state: Scenario
) -> None:
    named, second = sandbox.add_task("kie-standard", RUNNING), sandbox.add_task("kie-standard", state)
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id=named, started_minutes_ago=1)
    recorded(db, job, "kie-standard", named)
    recorded(db, job, "kie-standard", second)

    report = sweep(db, providers)

    expected = "orphan_billed" if state is DONE else "cancel"
    assert actions(report) == {named: "owned", second: expected}
    reason = "orphan_billed" if state is DONE else "orphan_running"  # KIE cannot cancel: reported
    assert [d["task_id"] for d in anomaly_details(db, job, reason)] == [second]
    assert sandbox.poll_count(named) == 0  # the task its job names is not even polled


def test_shadow_records_what_enforce_would_do_and_changes_nothing_else(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    task = sandbox.add_task("replicate-prediction", RUNNING)
    job = make_job(db, user, status="failed")
    recorded(db, job, "replicate-prediction", task)

    report, again = sweep(db, providers, shadow=True), sweep(db, providers, shadow=True)

    assert [s.done for s in report.tasks] == ["shadow: recorded"]
    assert [s.done for s in again.tasks] == ["shadow: already recorded"]
    assert sandbox.task_info(task)["canceled"] is False
    assert fates(db, job) == {task: None}
    with db.connect() as conn:
        decided = conn.execute(
            sa.text("SELECT action, mode FROM reconcile_decisions WHERE job_id = :j"), {"j": str(job)}
        ).all()
    assert [tuple(d) for d in decided] == [("orphan_cancel", "shadow")]


def test_orphans_without_act_writes_nothing_and_cancels_nothing(
    db: sa.Engine,
    sandbox: SandboxServer,
    providers: ProvidersResource,
    user: uuid.UUID,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(Settings.orphan_grace_s.name, "0")
    running, done = (
        sandbox.add_task("replicate-prediction", RUNNING),
        sandbox.add_task("replicate-prediction", DONE),
    )
    ended = make_job(db, user, status="failed")
    recorded(db, ended, "replicate-prediction", running)
    inflight = make_job(db, user, status="processing")
    recorded(db, inflight, "replicate-prediction", done)
    before, requests = snapshot(db), sandbox.stats()["requests_total"]

    assert main(["orphans", "--json", "--since", "1h"]) == 0
    printed = json.loads(capsys.readouterr().out)

    assert {t["task_id"]: (t["action"], t["done"]) for t in printed["tasks"]} == {
        running: ("cancel", "would cancel"),
        done: ("adopt", "would adopt"),
    }
    assert snapshot(db) == before
    assert sandbox.task_info(running)["canceled"] is False
    # Only the list pages went out (Replicate predictions and trainings, ElevenLabs dubs): no
    # cancel, no poll, no create.
    assert sandbox.stats()["requests_total"] == requests + 3


def test_a_late_on_task_created_after_a_sweep_is_cancelled_and_nothing_is_refunded_twice(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    from recon_dagster.reconcile.finalize import sweep_no_recovery

    job = make_job(db, user, status="processing", created_minutes_ago=200)
    reserve(db, job, user, 30)
    sweep_no_recovery(db, job)  # the stale sweep: failed and refunded
    refunded = balances(db, user)
    assert job_row(db, job)["status"] == "failed" and refunded == (Decimal(100), Decimal(50))
    late = providers.replicate.create("replicate-prediction", {"version": "v", "input": {"p": 1}})

    with pytest.raises(worker.JobNoLongerInFlight):
        worker.make_on_task_created(job, "replicate-prediction", engine=db)(late)
    first, again = sweep(db, providers), sweep(db, providers)

    assert actions(first) == {late: "cancel"}
    assert sandbox.task_info(late)["canceled"] is True
    assert actions(again) == {late: "ended"}  # canceled upstream: nothing bills, nothing more to do
    assert balances(db, user) == refunded
    assert job_row(db, job)["status"] == "failed"
    assert fates(db, job) == {late: "cancelled"}


def test_the_plan_shows_orphan_actions_and_does_not_take_them(
    db: sa.Engine,
    sandbox: SandboxServer,
    providers: ProvidersResource,
    user: uuid.UUID,
    capsys: pytest.CaptureFixture[str],
) -> None:
    task = sandbox.add_task("replicate-prediction", RUNNING)
    job = make_job(db, user, status="failed")
    recorded(db, job, "replicate-prediction", task)

    assert main(["plan", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)

    assert [(t["task_id"], t["action"], t["done"]) for t in printed["orphans"]["tasks"]] == [
        (task, "cancel", "would cancel")
    ]
    assert sandbox.task_info(task)["canceled"] is False
    assert fates(db, job) == {task: None}
