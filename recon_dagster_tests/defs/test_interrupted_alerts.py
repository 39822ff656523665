"""A run whose worker went away pages only when such runs keep dying (issue 48).

The failed runs here are recorded the way Dagster records them in the instance (the code server's
"run execution process ... terminated by signal 9" and its bare ``report_run_failed``; a worker
that got SIGTERM: ``UNEXPECTED_TERMINATION``); the real processes dying are in
``recon_dagster_tests/e2e/test_interrupted_runs.py``. Real failures (the health job with its
database gone) and real successes are executed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._core.events import JobFailureData, RunFailureReason

from recon_dagster.defs.alerts import interrupted
from recon_dagster_tests.defs.test_alerts import AlertTicks, _actions, _database_down, _targets
from recon_dagster_tests.support.alert_receivers import Receivers, alert_receivers
from recon_dagster_tests.support.reconcile import make_defs

JOB = "reconcile_health_job"


@pytest.fixture
def receivers() -> Iterator[Receivers]:
    with alert_receivers(secret="hooksecret0123456789") as r:
        yield r


KEY = f"runs:{JOB}"


def _died(instance: dg.DagsterInstance, job: dg.JobDefinition, how: str) -> None:
    """A run of ``job`` that ended without its worker, recorded as Dagster records it."""
    run = instance.create_run_for_job(job_def=job)
    if how == "killed":  # the code server saw its run process die (SIGKILL, the OOM killer)
        instance.report_engine_event(
            f"[DagsterApiServer] Run execution process for {run.run_id} was terminated by signal 9 (SIGKILL).",
            run,
        )
        instance.report_run_failed(run)
    else:  # the worker got SIGTERM (its code server stopped) and failed itself
        instance.report_run_failed(
            run,
            "Execution was interrupted unexpectedly.",
            JobFailureData(error=None, failure_reason=RunFailureReason.UNEXPECTED_TERMINATION),
        )


@pytest.mark.parametrize("how", ["killed", "terminated"])
def test_runs_a_deploy_interrupts_open_no_incident(instance, media_dir, receivers, how):
    defs = make_defs(media_dir)
    ticks = AlertTicks(defs, instance, _targets(receivers, "webhook"))
    ticks()
    job = defs.resolve_job_def(JOB)
    for _ in range(4):  # one deploy kills every run it finds at once
        _died(instance, job, how)
    ticks()
    assert _actions(receivers, "webhook") == [], ticks.messages
    assert ticks.open == {}


def test_runs_that_keep_dying_page_once_and_resolve_on_a_green_run(
    db, instance, media_dir, receivers, monkeypatch
):
    defs = make_defs(media_dir)
    ticks = AlertTicks(defs, instance, _targets(receivers, "webhook"))
    ticks()
    job = defs.resolve_job_def(JOB)
    began = time.time()
    for how in ("killed", "terminated", "killed"):  # three, but within one moment: one deploy
        _died(instance, job, how)
    # The loop's span, scaled down from 10 minutes: longer than that burst took on this machine.
    loop_s = time.time() - began + 2.0
    monkeypatch.setattr(interrupted, "LOOP_S", loop_s)
    ticks()
    assert _actions(receivers, "webhook") == [], ticks.messages
    time.sleep(loop_s + 0.2)
    for _ in range(3):  # still dying LOOP_S later, nothing succeeded since: a restart loop
        _died(instance, job, "killed")
        ticks()
    assert _actions(receivers, "webhook") == [("trigger", KEY)], ticks.messages
    body = receivers.accepted("/hook/")[0].json
    assert body["title"] == f"{JOB} runs keep dying before they finish"
    assert "runs in a row ended without their worker" in body["summary"] and "\n" not in body["summary"]

    assert job.execute_in_process(instance=instance, raise_on_error=False).success
    ticks()
    assert _actions(receivers, "webhook") == [("trigger", KEY), ("resolve", KEY)], ticks.messages


def test_a_green_run_between_deploys_breaks_the_loop(db, instance, media_dir, receivers, monkeypatch):
    monkeypatch.setattr(interrupted, "LOOP_S", 1.0)
    defs = make_defs(media_dir)
    ticks = AlertTicks(defs, instance, _targets(receivers, "webhook"))
    ticks()
    job = defs.resolve_job_def(JOB)
    for _ in range(2):
        _died(instance, job, "killed")
    time.sleep(1.2)
    assert job.execute_in_process(instance=instance, raise_on_error=False).success
    for _ in range(2):
        _died(instance, job, "terminated")
    ticks()
    assert _actions(receivers, "webhook") == [], ticks.messages


def test_an_interrupted_run_never_counts_into_a_real_incident(db, instance, media_dir, receivers):
    defs = make_defs(media_dir)
    ticks = AlertTicks(defs, instance, _targets(receivers, "webhook"))
    ticks()
    job = defs.resolve_job_def(JOB)
    with _database_down():
        for _ in range(2):  # failures of its own: these page
            assert not job.execute_in_process(instance=instance, raise_on_error=False).success
    ticks()
    for how in ("killed", "terminated"):
        _died(instance, job, how)
    ticks()
    assert ticks.open[KEY]["count"] == 2
    assert job.execute_in_process(instance=instance, raise_on_error=False).success
    ticks()
    assert _actions(receivers, "webhook") == [("trigger", KEY), ("resolve", KEY)], ticks.messages
    assert receivers.accepted("/hook/")[1].json["details"]["times_seen_failing"] == 2
