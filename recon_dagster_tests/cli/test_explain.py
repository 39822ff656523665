"""Find any job: a job id gives its whole story, from the ``explain_job`` run and
from ``recon-dagster explain``, for jobs reconciled inside a batch through ``reconcile_once``.

Real PostgreSQL, the loopback sandbox over HTTP, a real (temporary) Dagster instance."""

from __future__ import annotations

import json
import uuid

import dagster as dg
import pytest

from recon_dagster.cli.commands import main
from recon_dagster.core.runtags import JOB_COUNT_TAG
from recon_dagster.operator import explain as ex
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick


@pytest.fixture
def batch(db, sandbox, instance, media_dir):
    """Four KIE jobs reconciled as ONE batch run (recovered, failed upstream, two still running),
    then a second tick on the still-running ones and a sweep of a legacy row."""
    user = make_user(db)
    recovered, recovered_task = stale_job_with_task(
        db, sandbox, "kie-standard", Scenario(polls_before_done=0), user=user, minutes=60
    )[1:]
    failed, _ = stale_job_with_task(
        db, sandbox, "kie-standard", Scenario(outcome="fail", polls_before_done=0), user=user, minutes=60
    )[1:]
    running, running_task = stale_job_with_task(
        db, sandbox, "kie-standard", Scenario(outcome="run_forever"), user=user, minutes=60
    )[1:]
    running2, _ = stale_job_with_task(
        db, sandbox, "kie-standard", Scenario(outcome="run_forever"), user=user, minutes=60
    )[1:]
    legacy = make_job(db, user, created_minutes_ago=200)  # past the 3-hour pre-call budget
    reserve(db, legacy, user, 5)
    defs = make_defs(media_dir, single_run_below=2, cadence_seconds=0)
    first = tick(defs, instance)
    assert first.runs == 1, "the four due KIE jobs must be packed into one batch run"
    tick(defs, instance, sweep=True)
    return {
        "defs": defs,
        "recovered": (recovered, recovered_task),
        "failed": failed,
        "running": (running, running_task),
        "legacy": legacy,
    }


def _reconcile_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return list(reversed(instance.get_runs(filters=dg.RunsFilter(job_name="reconcile_job"))))


def test_a_job_inside_a_batch_has_its_attempt_run_credits_task_id_and_asset(db, instance, batch):
    job, task = batch["recovered"]
    story = ex.explain(db, instance, job)
    batch_run = _reconcile_runs(instance)[0]
    assert batch_run.tags[JOB_COUNT_TAG] == "4"

    assert story.status == "completed"
    assert story.provider_task_id == task
    assert [(a.attempt, a.outcome, a.run_id) for a in story.attempts] == [(1, "recovered", batch_run.run_id)]
    assert [c.status for c in story.credits] == ["committed"]
    assert {k: float(v) for k, v in story.credits[0].pools.items()} == {"from_sub": 20.0, "from_topup": 10.0}
    assert len(story.assets) == 1
    assert story.outcome == "completed; credits committed"

    md = ex.to_markdown(story, "http://ui.example:3000")
    assert f"(http://ui.example:3000/runs/{batch_run.run_id})" in md
    assert task in md and "committed" in md and "recovered" in md


def test_every_attempt_has_its_own_run_and_what_upstream_said(db, instance, batch):
    job, _ = batch["running"]
    story = ex.explain(db, instance, job)
    runs = _reconcile_runs(instance)
    assert [a.outcome for a in story.attempts] == ["still_running", "still_running"]
    assert [a.attempt for a in story.attempts] == [1, 2]
    run_ids = [a.run_id for a in story.attempts]
    assert None not in run_ids and len(set(run_ids)) == 2
    assert set(run_ids) <= {r.run_id for r in runs}
    assert story.reconcile_last_error and story.reconcile_last_error in (story.attempts[-1].detail or "")
    assert story.credits[0].status == "reserved"
    assert story.outcome.startswith("still processing after 2 attempt(s)")


def test_failed_and_swept_jobs_show_the_refund_and_the_run_that_did_it(db, instance, batch):
    failed = ex.explain(db, instance, batch["failed"])
    assert failed.status == "failed" and [c.status for c in failed.credits] == ["refunded"]
    assert failed.attempts[0].outcome == "failed" and failed.attempts[0].run_id is not None
    assert failed.error_message

    swept = ex.explain(db, instance, batch["legacy"])
    sweep_runs = instance.get_runs(filters=dg.RunsFilter(job_name="sync_sweep_job"))
    assert [a.outcome for a in swept.attempts] == ["swept"]
    assert swept.attempts[0].run_id == sweep_runs[0].run_id
    assert swept.provider_kind is None and swept.credits[0].status == "refunded"


def test_the_run_id_recorded_on_reconcile_events_wins_over_a_lookup(db, instance, batch):
    # reconcile_events.run_id (migration 141) names the run directly: no lookup by run key.
    job, _ = batch["recovered"]
    with db.begin() as conn:
        conn.exec_driver_sql(f"UPDATE reconcile_events SET run_id = 'recorded-run' WHERE job_id = '{job}'")
    story = ex.explain(db, None, job)
    assert [a.run_id for a in story.attempts] == ["recorded-run"]


def test_explain_job_run_writes_the_story_into_log_and_metadata(db, instance, batch):
    job, task = batch["recovered"]
    result = (
        batch["defs"]
        .resolve_job_def("explain_job")
        .execute_in_process(
            run_config={"ops": {"explain_job_story": {"config": {"job_id": str(job)}}}}, instance=instance
        )
    )
    assert result.success
    batch_run = _reconcile_runs(instance)[0]
    out = result.output_for_node("explain_job_story")
    assert out["status"] == "completed" and out["attempts"][0]["run_url"] == f"/runs/{batch_run.run_id}"
    [mat] = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
    meta = mat.event_specific_data.metadata  # type: ignore[union-attr]
    assert f"(/runs/{batch_run.run_id})" in meta["story"].value
    assert meta["provider_task_id"].value == task
    logs = "\n".join(e.message for e in instance.all_logs(result.run_id) if e.message and e.user_message)
    assert f"/runs/{batch_run.run_id}" in logs and "credits committed" in logs


def test_explain_job_with_an_unknown_or_malformed_id_fails_with_one_clear_line(db, instance, batch):
    job_def = batch["defs"].resolve_job_def("explain_job")
    for bad, words in ((str(uuid.uuid4()), "no job"), ("not-a-uuid", "not a job id")):
        result = job_def.execute_in_process(
            run_config={"ops": {"explain_job_story": {"config": {"job_id": bad}}}},
            instance=instance,
            raise_on_error=False,
        )
        assert not result.success
        [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        message = failure.event_specific_data.error.message  # type: ignore[union-attr]
        assert words in message and "\n" not in message.strip()


def test_cli_prints_the_story_with_run_urls_text_and_json(db, instance, batch, capsys, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", instance.root_directory)
    monkeypatch.setenv(ex.UI_URL_ENV, "http://dagster.internal:3000/")
    job, task = batch["recovered"]
    run_id = _reconcile_runs(instance)[0].run_id

    assert main(["explain", str(job)]) == 0
    text = capsys.readouterr().out
    assert f"http://dagster.internal:3000/runs/{run_id}" in text
    assert task in text and "committed" in text

    assert main(["explain", str(job), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["job_id"] == str(job) and data["provider_task_id"] == task
    assert data["attempts"][0]["run_url"] == f"http://dagster.internal:3000/runs/{run_id}"
    assert data["credits"][0]["status"] == "committed"


def test_cli_bad_and_unknown_ids_are_one_line_errors(db, capsys):
    assert main(["explain", "12345"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("recon-dagster explain: not a job id") and "\n" not in err

    missing = uuid.uuid4()
    assert main(["explain", str(missing)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"recon-dagster explain: no job {missing} in the jobs table"


def test_default_ui_url_and_relative_links(monkeypatch):
    monkeypatch.delenv(ex.UI_URL_ENV, raising=False)
    assert ex.ui_base_url() == "http://127.0.0.1:3000" and ex.ui_base_url(default=None) is None
    assert ex.run_url("abc", None) == "/runs/abc"
    assert ex.run_url("abc", "http://h:1") == "http://h:1/runs/abc"
    with pytest.raises(ex.ExplainError):
        ex.parse_job_id("")


def test_operator_actions_are_numbered_apart_from_reconcile_attempts(db, instance, media_dir, sandbox):
    """Issue 55, item 7: the story's attempt numbers are what the cap counts; an operator's retry
    and fail are ``op 1``, ``op 2`` and never counted among the attempts."""
    from recon_dagster.operator.actions import fail_now, retry_now

    _, job, _ = stale_job_with_task(db, sandbox, "kie-standard", Scenario(outcome="run_forever"), minutes=60)
    defs = make_defs(media_dir, cadence_seconds=0)
    tick(defs, instance)  # attempt 1
    retry_now(db, job, who="ann", why="provider back")
    tick(defs, instance)  # attempt 2
    fail_now(db, job, who="ann", reason="user asked")

    story = ex.explain(db, instance, job)
    assert ex.numbers(story) == ["#1", "op 1", "#2", "op 2"]
    text = ex.to_text(story, None)
    assert "attempts (2, and 2 operator action(s)" in text
    assert "op 1 operator_retry" in text and "op 2 operator_fail" in text
    markdown = ex.to_markdown(story, None)
    assert "| op 2 | operator_fail |" in markdown and "| #2 | still_running |" in markdown
    rows = ex.to_json(story, None)["attempts"]
    assert [(r["number"], r["counted"], r["operator_action"]) for r in rows] == [
        ("#1", True, False),
        ("op 1", False, True),
        ("#2", True, False),
        ("op 2", False, True),
    ]
