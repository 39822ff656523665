"""The operator's actions on one job (retry now, fail and refund), from the CLI
and the Launchpad, safe against a reconcile run working the same job; and the stuck_jobs table."""

from __future__ import annotations

import threading
from decimal import Decimal

import dagster as dg
import pytest

from recon_dagster.cli.commands import main
from recon_dagster.core.kinds import MAX_ATTEMPTS
from recon_dagster.db import jobs as jobs_db
from recon_dagster.defs.observe.stuck import fail_and_refund_job, retry_job_now, stuck_rows
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.operator.actions import FAIL, RETRY, OperatorError, fail_now, retry_now
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.finalize import MediaPolicy, ProviderResult, finalize_job_with_media
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import balances, job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import make_defs, one, stale_job_with_task, tick, usage_status


def _stuck(db, sandbox, scenario=None, attempts=0):
    """A KIE job an hour past its call, its task never ending by default, 10 credits reserved from a
    user with 100 subscription and no top-up credits. Returns ``(user, job)``."""
    user = make_user(db, sub=100, topup=0)
    scenario = scenario or Scenario(outcome="run_forever")
    return stale_job_with_task(
        db, sandbox, "kie-standard", scenario, minutes=60, attempts=attempts, user=user, credits=10
    )[:2]


def _due(db, job) -> bool:
    with db.connect() as conn:
        return job in {r.id for r in jobs_db.scan_stale(conn, 100)}


def _events(db, job, outcome):
    with db.connect() as conn:
        import sqlalchemy as sa

        return conn.execute(
            sa.text(
                "SELECT detail, run_key, run_id, attempt FROM reconcile_events WHERE job_id = :j AND outcome = :o"
            ),
            {"j": str(job), "o": outcome},
        ).all()


def test_retry_makes_a_job_waiting_out_its_cadence_due_now_and_the_attempt_still_counts(
    db, instance, media_dir, sandbox
):
    _, job = _stuck(db, sandbox)
    defs = make_defs(media_dir)
    tick(defs, instance)
    assert job_row(db, job)["reconcile_attempts"] == 1 and not _due(db, job)

    done = retry_now(db, job, who="alice", why="provider back up")

    assert _due(db, job)
    assert job_row(db, job)["reconcile_attempts"] == 1  # not counted by the retry itself
    assert "due now" in done.line
    [ev] = _events(db, job, RETRY)
    assert "alice" in ev.detail and "provider back up" in ev.detail and ev.run_key == "operator:alice"
    tick(defs, instance)
    assert job_row(db, job)["reconcile_attempts"] == 2


def test_fail_fails_and_refunds_once_records_who_and_why_and_refuses_a_terminal_job(db, sandbox):
    user, job = _stuck(db, sandbox)

    fail_now(db, job, who="bob", reason="user asked for a refund")

    row = job_row(db, job)
    assert row["status"] == "failed" and "user asked for a refund" in row["error_message"]
    assert usage_status(db, job) == "refunded"
    assert balances(db, user) == (Decimal(100), Decimal(0))
    [ev] = _events(db, job, FAIL)
    assert "bob" in ev.detail and "user asked for a refund" in ev.detail
    with pytest.raises(OperatorError, match="already failed"):
        fail_now(db, job, who="bob", reason="again")
    with pytest.raises(OperatorError, match="already failed"):
        retry_now(db, job, who="bob")
    assert balances(db, user) == (Decimal(100), Decimal(0))
    assert len(_events(db, job, FAIL)) == 1


def test_the_cli_retry_and_fail_commands_print_one_line_and_refuse_with_one_line(
    db, sandbox, capsys, monkeypatch, database_url
):
    monkeypatch.setenv("RECON_DATABASE_URL", database_url)
    monkeypatch.setenv("RECON_OPERATOR", "carol")
    _, job = _stuck(db, sandbox)

    assert main(["retry", str(job)]) == 0
    assert main(["fail", str(job), "--reason", "stuck on a dead task"]) == 0
    assert main(["fail", str(job), "--reason", "twice"]) == 1
    with pytest.raises(SystemExit) as usage:  # --reason is required: a usage error
        main(["fail", str(job)])
    assert usage.value.code == 2
    assert main(["retry", "not-a-uuid"]) == 1
    out, err = capsys.readouterr()
    assert "due now" in out and "refunded" in out
    lines = [ln for ln in err.splitlines() if ln.startswith("recon-dagster")]
    assert any("already failed" in ln for ln in lines) and any("not a job id" in ln for ln in lines)
    assert "Traceback" not in err
    assert "carol" in _events(db, job, FAIL)[0].detail


def _action(job: object, **fields: str) -> dict:
    return {"job_id": str(job), "operator": "erin", "reason": "dead task", **fields}


def test_the_launchpad_jobs_record_the_operator_and_the_run_and_fail_a_terminal_job_with_a_one_line_reason(
    db, instance, media_dir, sandbox
):
    """Dagster OSS has no users. The operator's name is a required field, recorded
    with the action and the run (and shown on the run's row); the reason is required too."""
    user, job = _stuck(db, sandbox)
    defs = make_defs(media_dir)
    cfg = {"ops": {"fail_and_refund_now_op": {"config": _action(job)}}}

    res = defs.resolve_job_def(fail_and_refund_job.name).execute_in_process(run_config=cfg, instance=instance)
    again = defs.resolve_job_def(fail_and_refund_job.name).execute_in_process(
        run_config=cfg, instance=instance, raise_on_error=False
    )
    retry = defs.resolve_job_def(retry_job_now.name).execute_in_process(
        run_config={"ops": {"retry_now_op": {"config": _action(job, reason="again")}}},
        instance=instance,
        raise_on_error=False,
    )

    assert res.success and job_row(db, job)["status"] == "failed"
    [event] = _events(db, job, FAIL)
    assert event.run_id == res.run_id
    # Then what became of its task upstream: KIE cannot cancel, the orphan sweep follows it.
    assert event.detail.startswith(f"by erin (Dagster run {res.run_id[:8]}): dead task; upstream task ")
    assert "kie cannot cancel it; handed to the orphan sweep" in event.detail
    assert (
        f"operator_failed by erin (Dagster run {res.run_id[:8]}): dead task"
        in job_row(db, job)["error_message"]
    )
    run = instance.get_run_by_id(res.run_id)
    assert (run.tags["recon/operator"], run.tags["recon/job"]) == ("erin", str(job))
    assert not again.success and not retry.success
    [failure] = [e for e in again.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    refused = failure.step_failure_data.user_failure_data.description
    # The refusal says how the job ended and by whom: a job id left over in the Launchpad shows.
    assert refused.startswith(f"job {job} is already failed (operator_failed by erin (Dagster run ")
    assert refused.endswith("UTC); nothing to fail")
    assert balances(db, user) == (Decimal(100), Decimal(0))


@pytest.mark.parametrize("job_name", ["fail_and_refund_job", "retry_job_now"])
@pytest.mark.parametrize("missing", ["job_id", "operator", "reason"])
def test_a_launchpad_action_needs_a_job_id_an_operator_and_a_reason_with_no_default(
    db, instance, media_dir, sandbox, job_name, missing
):
    _, job = _stuck(db, sandbox)
    defs = make_defs(media_dir)
    op = "fail_and_refund_now_op" if job_name == "fail_and_refund_job" else "retry_now_op"
    config = {k: v for k, v in _action(job).items() if k != missing}

    with pytest.raises(dg.DagsterInvalidConfigError, match=missing):
        defs.resolve_job_def(job_name).execute_in_process(
            run_config={"ops": {op: {"config": config}}}, instance=instance
        )
    # Nothing to pre-fill: the job's config has no default for any of the three.
    fields = defs.resolve_job_def(job_name).get_config_schema_snapshot()
    assert fields is not None
    assert job_row(db, job)["status"] == "processing"


@pytest.mark.parametrize("job_name", ["fail_and_refund_job", "retry_job_now"])
@pytest.mark.parametrize("blank", ["operator", "reason"])
def test_a_blank_operator_or_reason_is_refused_in_one_line_and_changes_nothing(
    db, instance, media_dir, sandbox, job_name, blank
):
    _, job = _stuck(db, sandbox)
    defs = make_defs(media_dir)
    op = "fail_and_refund_now_op" if job_name == "fail_and_refund_job" else "retry_now_op"

    res = defs.resolve_job_def(job_name).execute_in_process(
        run_config={"ops": {op: {"config": _action(job, **{blank: "   "})}}},
        instance=instance,
        raise_on_error=False,
    )

    assert not res.success
    [failure] = [e for e in res.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert failure.step_failure_data.user_failure_data.description.startswith(f"{blank} is required")
    assert job_row(db, job)["status"] == "processing" and _events(db, job, FAIL) == []


@pytest.mark.parametrize("round_", range(6))
def test_an_operator_fail_racing_a_run_that_finalizes_settles_the_job_exactly_once(
    db, sandbox, media_dir, round_
):
    user = make_user(db, sub=100, topup=0)
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=60)
    reserve(db, job, user, 10)
    providers = providers_from_env()
    result = ProviderResult.from_status(providers.poll("kie-standard", task))
    barrier = threading.Barrier(2)
    got: dict[str, object] = {}

    def run() -> None:
        barrier.wait()
        got["run"] = finalize_job_with_media(
            db, LocalMediaStore(base_dir=media_dir), job, result, source="reconcile",
            policy=MediaPolicy(headers_for=providers.media_headers),
        ).ok  # fmt: skip

    def operator() -> None:
        barrier.wait()
        try:
            fail_now(db, job, who="dave", reason="race")
            got["operator"] = True
        except OperatorError:
            got["operator"] = False

    threads = [threading.Thread(target=run), threading.Thread(target=operator)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted([got["run"], got["operator"]]) == [False, True]
    status = job_row(db, job)["status"]
    if got["operator"]:
        assert status == "failed" and usage_status(db, job) == "refunded"
        assert balances(db, user) == (Decimal(100), Decimal(0))
        assert len(_events(db, job, FAIL)) == 1
    else:
        assert status == "completed" and usage_status(db, job) == "committed"
        assert balances(db, user) == (Decimal(90), Decimal(0))
        assert _events(db, job, FAIL) == []
    assert int(one(db, "SELECT count(*) FROM usage_logs WHERE job_id = :j", j=job)) == 1


def test_stuck_jobs_lists_attempt_n_of_max_next_attempt_lease_and_last_upstream_answer(
    db, instance, media_dir, sandbox
):
    # Stuck: its provider gives no answer (a job whose poll says it still runs is not listed).
    _, job = _stuck(db, sandbox, Scenario(server_error_first=1_000_000), attempts=3)
    tick(make_defs(media_dir), instance)

    [row] = [r for r in _rows(db) if r["job_id"] == str(job)]
    assert row["attempt"] == f"4/{MAX_ATTEMPTS}" and row["attempts_left"] == MAX_ATTEMPTS - 4
    assert row["next_attempt"] != "now" and row["lease"] == "-"
    assert row["last_upstream"] != "-"


def _rows(db):
    with db.connect() as conn:
        return stuck_rows(conn)


def test_the_health_job_materializes_stuck_jobs_with_its_table(db, instance, media_dir, sandbox):
    _, job = _stuck(db, sandbox, Scenario(server_error_first=1_000_000), attempts=3)
    defs = make_defs(media_dir)
    tick(defs, instance)

    res = defs.resolve_job_def("reconcile_health_job").execute_in_process(
        instance=instance, raise_on_error=False
    )

    assert res.success, [e.message for e in res.all_events if e.is_failure]
    event = instance.get_latest_materialization_event(dg.AssetKey("stuck_jobs"))
    table = event.asset_materialization.metadata["jobs"].value
    assert str(job) in table and f"4/{MAX_ATTEMPTS}" in table
