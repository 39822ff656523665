"""The ``plan_reconcile`` job shows what the orphan sweep would do, as ``recon-dagster plan``
does (issue 49: the job showed only the jobs' plan), and still writes and cancels nothing."""

from __future__ import annotations

import uuid

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.config import Settings
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.factories import make_job
from recon_dagster_tests.support.orphans import recorded, snapshot
from recon_dagster_tests.support.reconcile import make_defs
from recon_dagster_tests.support.world import LIMITER_TABLES

KIND = "replicate-prediction"


def _output_metadata(result: dg.ExecuteInProcessResult) -> dict:
    [out] = [
        e
        for e in result.all_events
        if e.event_type_value == "STEP_OUTPUT" and e.step_key == "plan_reconcile_table"
    ]
    return out.event_specific_data.metadata


def test_the_plan_job_shows_the_orphan_sweeps_actions_and_acts_on_none(
    db: sa.Engine,
    sandbox: SandboxServer,
    media_dir: str,
    instance: dg.DagsterInstance,
    user: uuid.UUID,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(Settings.orphan_grace_s.name, "0")
    sandbox.reset()
    ours = sandbox.add_task(KIND, Scenario(outcome="run_forever"))  # its job ended: the sweep cancels it
    unknown = sandbox.add_task(KIND, Scenario(outcome="run_forever"))
    recorded(db, make_job(db, user, status="failed"), KIND, ours)
    before = snapshot(db)

    result = make_defs(media_dir).resolve_job_def("plan_reconcile").execute_in_process(instance=instance)

    assert result.success
    meta = _output_metadata(result)
    shown = meta["orphans"].value
    assert (
        f"cancel        replicate/predictions {ours}" in shown
        and f"unknown       replicate/predictions {unknown}" in shown
    )
    assert meta["orphan_actions"].value == {"cancel": 1, "unknown": 1}
    assert sandbox.task_info(ours)["canceled"] is False
    assert {t: d for t, d in snapshot(db).items() if t not in LIMITER_TABLES} == {
        t: d for t, d in before.items() if t not in LIMITER_TABLES
    }


def test_without_polling_the_plan_job_asks_no_provider_for_its_tasks(
    db: sa.Engine, sandbox: SandboxServer, media_dir: str, instance: dg.DagsterInstance
) -> None:
    sandbox.reset()
    result = (
        make_defs(media_dir)
        .resolve_job_def("plan_reconcile")
        .execute_in_process(
            run_config={"ops": {"plan_reconcile_table": {"config": {"no_poll": True}}}}, instance=instance
        )
    )
    assert result.success
    assert "orphans" not in _output_metadata(result)
    assert sandbox.requests_total() == 0
