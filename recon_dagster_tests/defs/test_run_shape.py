"""The run's shape and what it records (tags, claims at run start, attempts, events), on real
PostgreSQL, the loopback sandbox and a real Dagster instance.

The sensor only reads; each run claims its jobs when it starts, so a preview, a daemon crash
between evaluation and submission, or time spent queued never touches a job row or an attempt.
"""

from __future__ import annotations

import uuid

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin

from recon_dagster.core.kinds import MAX_ATTEMPTS
from recon_dagster.core.runtags import ATTEMPT_TAG, LEGACY_WORK_TAG, WORK_TAG, tagged_job_ids
from recon_dagster.db.jobs import Claim
from recon_dagster.providers import ProvidersResource
from recon_dagster.reconcile.reconciler import Reconciler
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import (
    evaluate_sensor,
    make_defs,
    one,
    stale_job_with_task,
    tick,
    usage_status,
)

RUN_KEY_TAG = "dagster/run_key"


def _jobs(db: sa.Engine) -> list[dict]:
    with db.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text("SELECT * FROM jobs ORDER BY id")).mappings()]


def _expire_leases(db: sa.Engine) -> None:
    """What the passing of the lease TTL (and of the cadence) looks like to the rows."""
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_lease_expires_at = now() - interval '1 second' "
                "WHERE reconcile_lease_expires_at IS NOT NULL"
            )
        )
        conn.execute(sa.text("UPDATE jobs SET reconcile_next_at = NULL"))


def _execute(defs: dg.Definitions, instance: dg.DagsterInstance, rr: dg.RunRequest, **extra_tags: str):
    job = defs.resolve_job_def("reconcile_job")
    return job.execute_in_process(
        run_config=rr.run_config,
        instance=instance,
        partition_key=rr.partition_key,
        tags={**rr.tags, RUN_KEY_TAG: rr.run_key, **extra_tags},
        raise_on_error=False,
    )


def test_evaluating_the_sensor_changes_no_job_row(db, instance, media_dir, sandbox):
    stale_job_with_task(db, sandbox, "kie-standard")
    stale_job_with_task(db, sandbox, "replicate-prediction", attempts=3)
    # A job whose run died holding the lease (expired), and a backlog kind packed into a batch.
    _, crashed, _ = stale_job_with_task(db, sandbox, "kie-veo", job_type="video", attempts=2)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_lease_owner = 'dead-run', "
                "reconcile_lease_expires_at = now() - interval '1 minute' WHERE id = :j"
            ),
            {"j": str(crashed)},
        )
    for _ in range(4):
        stale_job_with_task(db, sandbox, "kie-suno", job_type="music")
    defs = make_defs(media_dir, single_run_below=3, batch_size=10)
    before = _jobs(db)

    first = evaluate_sensor(defs, instance)
    second = evaluate_sensor(defs, instance)  # a preview, then the daemon's tick: same answer

    assert _jobs(db) == before
    assert len(first.run_requests) == 4
    assert [r.run_key for r in first.run_requests] == [r.run_key for r in second.run_requests]
    [takeover] = [r for r in first.run_requests if tagged_job_ids(r.tags) == {str(crashed)}]
    assert takeover.run_key == f"{crashed}:4"  # the dead run's attempt (3) counts: this is the 4th


def test_a_daemon_crash_between_evaluation_and_submission_loses_nothing(db, instance, media_dir, sandbox):
    _, job, _ = stale_job_with_task(db, sandbox, "kie-standard")
    defs = make_defs(media_dir)

    [rr] = evaluate_sensor(defs, instance).run_requests
    # The daemon created the run and died before submitting it: the run sits in NOT_STARTED.
    instance.create_run_for_job(
        defs.resolve_job_def("reconcile_job"),
        run_config=rr.run_config,
        tags={**rr.tags, RUN_KEY_TAG: rr.run_key},
        status=dg.DagsterRunStatus.NOT_STARTED,
    )
    [again] = evaluate_sensor(defs, instance).run_requests

    # The same work under the same key: Dagster submits the stranded run instead of a second one.
    assert again.run_key == rr.run_key and again.run_config == rr.run_config
    assert job_row(db, job)["reconcile_lease_owner"] is None
    assert _execute(defs, instance, again).success
    assert job_row(db, job)["status"] == "completed"


def test_time_spent_queued_is_never_an_attempt(db, instance, media_dir, sandbox):
    _, job, _ = stale_job_with_task(db, sandbox, "kie-standard", Scenario(outcome="run_forever"))
    defs = make_defs(media_dir)
    [rr] = evaluate_sensor(defs, instance).run_requests
    # What the daemon's submission leaves behind: a QUEUED run waiting for a free slot.
    queued = instance.create_run_for_job(
        defs.resolve_job_def("reconcile_job"),
        run_config=rr.run_config,
        tags={**rr.tags, RUN_KEY_TAG: rr.run_key},
        status=dg.DagsterRunStatus.QUEUED,
        remote_job_origin=RemoteJobOrigin(
            RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("recon_dagster"), "__repository__"),
            "reconcile_job",
        ),
    )

    _expire_leases(db)  # the run waits in the queue past the lease TTL
    during = evaluate_sensor(defs, instance)
    instance.delete_run(queued.run_id)  # ... and now it starts
    result = _execute(defs, instance, rr)

    assert during.run_requests == []  # its job is spoken for while it is queued
    assert result.success
    row = job_row(db, job)
    assert row["status"] == "processing"
    assert row["reconcile_attempts"] == 1  # one real poll, one attempt
    assert one(db, "SELECT count(*) FROM reconcile_events WHERE job_id = :j", j=job) == 1


class _Crash(BaseException):
    """The run's process dies mid-attempt (not an exception any handler would catch)."""


def test_a_job_whose_runs_keep_crashing_is_force_failed_at_the_cap(
    db, instance, media_dir, sandbox, monkeypatch
):
    user, job, _ = stale_job_with_task(
        db, sandbox, "kie-standard", Scenario(outcome="run_forever"), attempts=MAX_ATTEMPTS - 4
    )

    def crash(self, kind, task_id):
        raise _Crash()

    monkeypatch.setattr(ProvidersResource, "poll", crash)
    defs = make_defs(media_dir)
    for _ in range(MAX_ATTEMPTS + 4):  # bounded: today's code loops forever
        requests = evaluate_sensor(defs, instance).run_requests
        if not requests:
            break
        [rr] = requests
        _execute(defs, instance, rr)  # dies mid-attempt, holding the lease
        for run in instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
            instance.report_run_failed(run)  # run monitoring notices a dead run
        _expire_leases(db)
    crashed = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))

    row = job_row(db, job)
    assert row["status"] == "failed"
    assert row["reconcile_attempts"] == MAX_ATTEMPTS
    assert len(crashed) == 4  # attempts 15, 16, 17 and 18 each started and died
    assert usage_status(db, job) == "refunded"
    anomalies = "SELECT count(*) FROM credit_anomalies WHERE job_id = :j AND reason = 'reconcile_exhausted'"
    assert one(db, anomalies, j=job) == 1
    assert one(db, "SELECT count(*) FROM usage_logs WHERE user_id = :u AND status = 'refunded'", u=user) == 1


def test_two_runs_carrying_the_same_job_never_both_work_it(db, instance, media_dir, sandbox):
    _, job, task = stale_job_with_task(db, sandbox, "kie-standard")
    defs = make_defs(media_dir)
    [rr] = evaluate_sensor(defs, instance).run_requests
    # Run A has started: its first op claimed the job and is polling ...
    a = _reconciler(defs)
    config = rr.run_config["ops"]["claim_and_poll"]["config"]
    planned = [Claim(uuid.UUID(j), n) for j, n in zip(config["job_ids"], config["attempts"], strict=True)]
    rows, settled = a.claim(planned, rr.run_key)
    assert [r.id for r in rows] == [job] and settled == []
    # ... when run B, carrying the same job under another key (its batch changed), starts too.
    other = dg.RunRequest(
        run_key=f"{rr.run_key}-other", partition_key=rr.partition_key, run_config=rr.run_config, tags=rr.tags
    )
    b = _execute(defs, instance, other)
    outcomes = a.act(a.poll(rows), rr.run_key)

    assert b.success
    assert [o.outcome.value for o in outcomes] == ["recovered"]
    assert sorted(e.outcome for e in _events(db, job)) == ["recovered", "skipped"]
    assert sandbox.poll_count(task) == 1  # B never even polled
    assert job_row(db, job)["status"] == "completed"
    assert one(db, "SELECT count(*) FROM usage_logs WHERE job_id = :j AND status = 'committed'", j=job) == 1


def _reconciler(defs: dg.Definitions) -> Reconciler:
    settings = defs.resources["reconcile_settings"]
    providers = defs.resources["providers"]
    return Reconciler(
        defs.resources["database"].get_engine(),
        providers,
        defs.resources["media_store"],
        settings=settings.settings(),
        media_policy=settings.media_policy(providers.media_headers),
    )


def _events(db: sa.Engine, job: uuid.UUID) -> list:
    with db.connect() as conn:
        return list(
            conn.execute(
                sa.text("SELECT * FROM reconcile_events WHERE job_id = :j ORDER BY id"), {"j": str(job)}
            )
        )


def test_the_attempt_tag_equals_the_attempt_in_the_log_and_events_link_the_run(
    db, instance, media_dir, sandbox
):
    _, job, _ = stale_job_with_task(
        db, sandbox, "replicate-prediction", Scenario(outcome="run_forever"), attempts=3
    )
    defs = make_defs(media_dir)
    [rr] = evaluate_sensor(defs, instance).run_requests

    result = _execute(defs, instance, rr)

    assert rr.tags[ATTEMPT_TAG] == "4"
    assert rr.run_key == f"{job}:4"
    [event] = _events(db, job)
    assert (event.attempt, event.outcome, event.run_key, event.run_id) == (
        4,
        "still_running",
        rr.run_key,
        result.run_id,
    )
    assert job_row(db, job)["reconcile_attempts"] == 4
    logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert any(f"job {job} [replicate-prediction] attempt 4:" in m for m in logs)


def test_the_run_graph_shows_the_design_cards_steps(db, instance, media_dir, sandbox):
    stale_job_with_task(db, sandbox, "kie-standard")  # succeeded upstream
    stale_job_with_task(db, sandbox, "kie-standard", Scenario(outcome="fail", polls_before_done=0))
    stale_job_with_task(db, sandbox, "kie-standard", Scenario(outcome="run_forever"))
    defs = make_defs(media_dir, single_run_below=2)
    [rr] = evaluate_sensor(defs, instance).run_requests

    result = _execute(defs, instance, rr)

    steps = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"}
    assert steps == {
        "claim_and_poll",
        "finalize_succeeded",
        "fail_and_refund",
        "count_attempts",
        "record_outcomes",
        "outage_check",
    }
    assert [o.outcome.value for o in result.output_for_node("finalize_succeeded")] == ["recovered"]
    assert [o.outcome.value for o in result.output_for_node("fail_and_refund")] == ["failed"]
    assert [o.outcome.value for o in result.output_for_node("count_attempts")] == ["still_running"]
    # A batch run lists its job ids in its metadata.
    [report] = [
        e
        for e in result.all_events
        if e.event_type_value == "STEP_OUTPUT" and e.step_key == "record_outcomes"
    ]
    listed = report.event_specific_data.metadata["job_ids"].value
    assert sorted(listed) == sorted(rr.run_config["ops"]["claim_and_poll"]["config"]["job_ids"])


def test_steps_with_nothing_to_do_are_skipped_and_the_run_still_records(db, instance, media_dir, sandbox):
    stale_job_with_task(db, sandbox, "kie-standard")
    defs = make_defs(media_dir)
    [rr] = evaluate_sensor(defs, instance).run_requests

    result = _execute(defs, instance, rr)

    ran = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"}
    skipped = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SKIPPED"}
    assert ran == {"claim_and_poll", "finalize_succeeded", "record_outcomes", "outage_check"}
    assert skipped == {"fail_and_refund", "count_attempts"}


def _materializations(instance: dg.DagsterInstance, key: str) -> list:
    records = instance.fetch_materializations(dg.AssetKey(key), limit=100).records
    return [r.asset_materialization for r in records]


def test_each_run_records_its_outcomes_per_provider_kind(db, instance, media_dir, sandbox):
    stale_job_with_task(db, sandbox, "kie-standard")
    stale_job_with_task(db, sandbox, "kie-standard", Scenario(outcome="fail", polls_before_done=0))
    stale_job_with_task(
        db, sandbox, "kie-standard", Scenario(outcome="run_forever"), attempts=MAX_ATTEMPTS - 1
    )
    stale_job_with_task(db, sandbox, "kie-standard", Scenario(outcome="run_forever"))
    defs = make_defs(media_dir, single_run_below=2)

    tick(defs, instance)

    [m] = _materializations(instance, "reconcile_outcomes")
    assert m.partition == "kie-standard"
    figures = {k.removeprefix("kie-standard: "): v.value for k, v in m.metadata.items()}
    assert figures["recovered (jobs)"] == 1
    assert figures["failed_refunded (jobs)"] == 1
    assert figures["force_failed (jobs)"] == 1  # its own series, not folded into failed
    assert figures["still_running (jobs)"] == 1
    # A figure that is zero and was never anything else is not written: no flat plot.
    assert "errors (jobs)" not in figures and "swept (jobs)" not in figures
    assert figures["credits_committed (credits)"] == 30.0
    assert figures["credits_refunded (credits)"] == 60.0


def test_a_run_in_which_every_job_errored_fails_after_counting_attempts(db, instance, media_dir, sandbox):
    jobs = [
        stale_job_with_task(
            db, sandbox, "kie-standard", Scenario(server_error_first=1000, polls_before_done=0)
        )[1]
        for _ in range(3)
    ]
    defs = make_defs(media_dir, single_run_below=2)

    report = tick(defs, instance)

    assert report.runs == 1 and report.failed_runs == 1
    assert report.summary.errors == 3
    for job in jobs:
        row = job_row(db, job)
        assert (row["status"], row["reconcile_attempts"], row["reconcile_lease_owner"]) == (
            "processing",
            1,
            None,
        )
    [run] = instance.get_runs(filters=dg.RunsFilter(job_name="reconcile_job"))
    assert run.status == dg.DagsterRunStatus.FAILURE
    [m] = _materializations(instance, "reconcile_outcomes")  # recorded before the run failed
    assert m.metadata["kie-standard: errors (jobs)"].value == 3


def test_partial_errors_keep_the_run_green_and_log_a_warning(db, instance, media_dir, sandbox, caplog):
    stale_job_with_task(db, sandbox, "kie-standard", Scenario(server_error_first=1000, polls_before_done=0))
    stale_job_with_task(db, sandbox, "kie-standard")
    defs = make_defs(media_dir, single_run_below=2)
    [rr] = evaluate_sensor(defs, instance).run_requests

    result = _execute(defs, instance, rr)

    assert result.success
    warnings = [
        e
        for e in instance.all_logs(result.run_id)
        if e.level == 30 and "1 of 2 job(s) errored" in e.user_message
    ]
    assert warnings


def test_health_checks_fail_on_an_outage_and_on_a_force_fail(db, instance, media_dir, sandbox):
    for _ in range(6):
        stale_job_with_task(
            db, sandbox, "kie-standard", Scenario(server_error_first=1000, polls_before_done=0)
        )
    stale_job_with_task(
        db, sandbox, "replicate-prediction", Scenario(outcome="run_forever"), attempts=MAX_ATTEMPTS - 1
    )
    stale_job_with_task(db, sandbox, "replicate-prediction")
    defs = make_defs(media_dir, single_run_below=100)
    tick(defs, instance)

    result = defs.resolve_job_def("reconcile_health_job").execute_in_process(
        instance=instance, raise_on_error=False
    )

    checks = {
        e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }
    # The health asset writes its providers' evaluations after its materialization, naming it
    # (so no window reads "not evaluated"), and its step then fails while a provider is DOWN: the
    # evaluations are the instance's, not this run's step events.
    # KIE is down (6 of 6 jobs got no answer); Replicate answered (a job running past its last
    # attempt was answered "running" each time); the idle providers' checks are left alone.
    step_failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert any("kie DOWN" in str(e.event_specific_data) for e in step_failures)
    assert _latest_health_check(instance, "kie") is False
    assert _latest_health_check(instance, "replicate") is True
    assert _latest_health_check(instance, "elevenlabs") is None
    assert _latest_health_check(instance, "anthropic") is None
    assert checks["no_new_exhausted_jobs"] is False
    backlog = result.asset_materializations_for_node("inflight_backlog")[0].metadata
    # Every kind, every time, zeros included.
    assert backlog["inflight/kie-standard"].value == 6
    assert all(f"stale/{k}" in backlog and f"inflight/{k}" in backlog for k in _kinds())


def _latest_health_check(instance, provider: str) -> bool | None:
    """The latest evaluation of ``provider_health``'s check of ``provider``: passed, or None if
    it was never evaluated."""
    key = dg.AssetCheckKey(dg.AssetKey("provider_health"), provider)
    records = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)
    event = records[0].event if records else None
    if event is None or event.dagster_event is None:
        return None
    data = event.dagster_event.event_specific_data
    return getattr(data, "passed", None)


def _kinds() -> list[str]:
    from recon_dagster.core.kinds import KIND_NAMES

    return list(KIND_NAMES)


def test_a_run_launched_without_job_ids_works_its_partitions_due_jobs(db, instance, media_dir, sandbox):
    _, standard, _ = stale_job_with_task(db, sandbox, "kie-standard")
    _, other, _ = stale_job_with_task(db, sandbox, "replicate-prediction")
    defs = make_defs(media_dir)

    # What "Launch backfill" or the Launchpad does: a partition and no run config.
    result = defs.resolve_job_def("reconcile_job").execute_in_process(
        instance=instance, partition_key="kie-standard", raise_on_error=False
    )

    assert result.success
    assert job_row(db, standard)["status"] == "completed"
    assert job_row(db, other)["status"] == "processing"
    assert job_row(db, other)["reconcile_attempts"] == 0
    [event] = _events(db, standard)
    assert event.run_key == f"run:{result.run_id}" and event.attempt == 1


def test_unknown_job_ids_in_the_run_config_are_a_clear_error(db, instance, media_dir, sandbox):
    defs = make_defs(media_dir)
    result = defs.resolve_job_def("reconcile_job").execute_in_process(
        instance=instance,
        partition_key="kie-standard",
        run_config={"ops": {"claim_and_poll": {"config": {"job_ids": ["not-a-uuid"], "attempts": [1]}}}},
        raise_on_error=False,
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "bad job id" in failure.message or "bad job id" in str(failure.event_specific_data)


@pytest.mark.parametrize("legacy", [False, True], ids=["hidden-work-tag", "runs-of-an-older-release"])
def test_work_whose_run_failed_before_claiming_gets_a_fresh_key(db, instance, media_dir, sandbox, legacy):
    _, job, _ = stale_job_with_task(db, sandbox, "kie-standard")
    defs = make_defs(media_dir)
    [rr] = evaluate_sensor(defs, instance).run_requests
    tags = dict(rr.tags)
    if legacy:  # requested before the work tag was hidden: "recon/work"
        tags[LEGACY_WORK_TAG] = tags.pop(WORK_TAG)
    for n in range(2):  # the code server timed out: each run failed before its first op
        instance.create_run_for_job(
            defs.resolve_job_def("reconcile_job"),
            run_config=rr.run_config,
            tags={**tags, RUN_KEY_TAG: rr.run_key if n == 0 else f"{rr.run_key}~{n}"},
            status=dg.DagsterRunStatus.FAILURE,
        )

    [again] = evaluate_sensor(defs, instance).run_requests

    assert again.run_key == f"{job}:1~2"  # not the launched keys Dagster would refuse
    assert again.tags[ATTEMPT_TAG] == "1"  # no attempt was made
    assert _execute(defs, instance, again).success
    assert job_row(db, job)["status"] == "completed"


def test_the_sweep_records_its_outcomes_too(db, instance, media_dir, sandbox):
    from recon_dagster.core.kinds import SYNC_KINDS

    kind = sorted(SYNC_KINDS)[0]
    user = make_user(db)
    job = make_job(db, user, job_type="text", provider_kind=kind, started_minutes_ago=60)
    reserve(db, job, user, 30, from_sub=20, from_topup=10)
    defs = make_defs(media_dir)

    assert defs.resolve_job_def("sync_sweep_job").execute_in_process(instance=instance).success

    [m] = _materializations(instance, "reconcile_outcomes")
    assert m.partition == kind
    assert (
        m.metadata[f"{kind}: swept (jobs)"].value,
        m.metadata[f"{kind}: credits_refunded (credits)"].value,
    ) == (1, 30.0)


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"job_ids": "not-a-list", "attempts": [1]}, "job_ids must be a list, got str"),
        ({"job_ids": [17], "attempts": [1]}, "job_ids[0] is 17"),
        ({"job_ids": [str(uuid.uuid4())], "attempts": ["1"]}, "attempts[0] is '1'"),
        ({"job_ids": [str(uuid.uuid4())], "attempts": [1.5]}, "attempts[0] is 1.5"),
        ({"job_ids": [str(uuid.uuid4())], "attempts": [True]}, "attempts[0] is True"),
    ],
)
def test_a_malformed_batch_config_fails_the_run_naming_the_field(
    db, instance, media_dir, sandbox, config, named
):
    """The batch lists are typed ``Any`` for Dagster (it would walk them element by element on
    every resolve of the run's config); the op's config checks them instead, before any claim."""
    _, job, _ = stale_job_with_task(db, sandbox, "kie-standard", Scenario(polls_before_done=0))
    defs = make_defs(media_dir)
    result = defs.resolve_job_def("reconcile_job").execute_in_process(
        instance=instance,
        partition_key="kie-standard",
        run_config={"ops": {"claim_and_poll": {"config": config}}},
        raise_on_error=False,
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    error, messages = failure.step_failure_data.error, []
    while error is not None:
        messages.append(error.message)
        error = error.cause
    assert any(named in m for m in messages), messages
    row = job_row(db, job)
    assert row["status"] == "processing" and row["reconcile_attempts"] == 0
