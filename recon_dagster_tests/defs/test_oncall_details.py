"""The smaller things an on-call engineer meets: ``explain_job`` numbers its
runs in the order they worked the job and never shows two different attempt counts under one name;
an intended outage failure prints its reason, not Dagster's stack frames, on the console."""

from __future__ import annotations

import dagster as dg
import sqlalchemy as sa

from recon_dagster.defs.reconcile.console import CONSOLE_RUN_CONFIG, concise_console_logger
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick


def test_explain_job_numbers_its_runs_by_time_and_names_both_counts(db, instance, media_dir, sandbox):
    _, job, _ = stale_job_with_task(db, sandbox, "kie-standard", Scenario(outcome="run_forever"))
    defs = make_defs(media_dir, cadence_seconds=0)
    runs = []
    for _ in range(3):
        tick(defs, instance)
        runs.append(instance.get_runs(filters=dg.RunsFilter(job_name="reconcile_job"), limit=1)[0].run_id)
        with db.begin() as conn:
            conn.execute(sa.text("UPDATE jobs SET reconcile_next_at = now() WHERE id = :j"), {"j": str(job)})

    result = defs.resolve_job_def("explain_job").execute_in_process(
        run_config={"ops": {"explain_job_story": {"config": {"job_id": str(job)}}}}, instance=instance
    )

    meta = result.output_for_node("explain_job_story")
    entries = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"][
        0
    ].event_specific_data.metadata
    labels = [k for k in entries if k.startswith("run ")]
    assert labels == ["run 1 (attempt 1)", "run 2 (attempt 2)", "run 3 (attempt 3)"], labels
    assert [entries[k].value.rsplit("/", 1)[1] for k in labels] == runs  # the first run is run 1
    assert entries["reconcile_attempts"].value == 3 and "attempts" not in entries
    assert entries["story_events"].value == len(meta["attempts"])


def test_an_intended_failure_prints_its_reason_without_dagster_frames(capfd):
    @dg.op
    def outage() -> None:
        raise dg.Failure(description="elevenlabs outage: none of the 3 job(s) of this run got an answer")

    @dg.op
    def bug() -> None:
        raise RuntimeError("a real bug")

    @dg.job(logger_defs={"console": concise_console_logger}, config=CONSOLE_RUN_CONFIG)
    def intended() -> None:
        outage()

    @dg.job(logger_defs={"console": concise_console_logger}, config=CONSOLE_RUN_CONFIG)
    def crash() -> None:
        bug()

    assert not intended.execute_in_process(raise_on_error=False).success
    printed = capfd.readouterr().err
    assert (
        printed.count("elevenlabs outage: none of the 3 job(s) of this run got an answer") == 2
    )  # step, run
    assert "Stack Trace:" not in printed and 'File "' not in printed
    assert "its stack trace is in the run's event log" in printed

    assert not crash.execute_in_process(raise_on_error=False).success
    printed = capfd.readouterr().err
    assert "Stack Trace:" in printed  # a crash keeps Dagster's whole report
