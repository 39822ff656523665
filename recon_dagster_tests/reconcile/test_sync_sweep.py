"""The sync sweep, through Dagster against real PostgreSQL: a sync call (or a legacy row, or an async
one that never got a task id) past its threshold is failed and refunded once; rows within their
threshold, terminal rows and pipeline wrappers are left alone."""

from __future__ import annotations

from decimal import Decimal

import dagster as dg

from recon_dagster.definitions import defs as project_defs
from recon_dagster_tests.support.factories import balances, job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import make_defs, tick, usage_status


def _sweep(defs: dg.Definitions, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    job = defs.resolve_job_def("sync_sweep_job")
    return job.execute_in_process(instance=instance)


def test_stale_anthropic_sync_job_is_failed_and_refunded_after_one_sweep(db, instance, media_dir, sandbox):
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user, provider_kind="anthropic-sync", started_minutes_ago=6)
    reserve(db, job, user, 30, from_sub=20, from_topup=10)

    assert _sweep(make_defs(media_dir), instance).success

    row = job_row(db, job)
    assert row["status"] == "failed"
    assert row["error_message"] == "reconcile_no_recovery"
    assert usage_status(db, job) == "refunded"
    assert balances(db, user) == (Decimal(100), Decimal(50))


def test_pending_kie_llm_without_reservation_is_failed_without_a_refund(db, instance, media_dir, sandbox):
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user, status="pending", provider_kind="kie-llm", started_minutes_ago=6)

    assert _sweep(make_defs(media_dir), instance).success

    assert job_row(db, job)["status"] == "failed"
    assert balances(db, user) == (Decimal(100), Decimal(50))


def test_legacy_row_without_provider_kind_is_swept_after_the_precall_budget(db, instance, media_dir, sandbox):
    user = make_user(db)
    job = make_job(db, user, created_minutes_ago=181)
    reserve(db, job, user, 5)

    assert _sweep(make_defs(media_dir), instance).success

    assert job_row(db, job)["status"] == "failed"
    assert usage_status(db, job) == "refunded"


def test_rows_within_threshold_or_terminal_are_left_alone(db, instance, media_dir, sandbox):
    user = make_user(db)
    fresh = make_job(db, user, provider_kind="anthropic-sync", started_minutes_ago=4)
    done = make_job(db, user, status="completed", provider_kind="anthropic-sync", started_minutes_ago=60)
    cancelled = make_job(db, user, status="cancelled", provider_kind="kie-llm", started_minutes_ago=60)
    reserve(db, fresh, user, 5)

    assert _sweep(make_defs(media_dir), instance).success

    assert job_row(db, fresh)["status"] == "processing"
    assert usage_status(db, fresh) == "reserved"
    assert job_row(db, done)["status"] == "completed"
    assert job_row(db, cancelled)["status"] == "cancelled"


def test_sweeping_twice_gives_the_same_final_state(db, instance, media_dir, sandbox):
    user = make_user(db, sub=100, topup=0)
    jobs = [make_job(db, user, provider_kind="elevenlabs-sync", started_minutes_ago=10) for _ in range(3)]
    for j in jobs:
        reserve(db, j, user, 10)
    defs = make_defs(media_dir)

    assert _sweep(defs, instance).success
    first = [(job_row(db, j)["status"], usage_status(db, j)) for j in jobs], balances(db, user)
    assert _sweep(defs, instance).success
    second = [(job_row(db, j)["status"], usage_status(db, j)) for j in jobs], balances(db, user)

    assert first == second
    assert balances(db, user) == (Decimal(100), Decimal(0))


def test_async_kind_without_task_id_is_swept_by_the_sensor_path_too(db, instance, media_dir, sandbox):
    """A stall before on_task_created: the reconcile job routes it to the sweep (5.6)."""
    user = make_user(db)
    job = make_job(db, user, provider_kind="kie-standard", started_minutes_ago=30)
    reserve(db, job, user, 8, from_sub=8, from_topup=0)

    report = tick(make_defs(media_dir), instance)

    assert report.runs == 1 and report.failed_runs == 0
    assert job_row(db, job)["status"] == "failed"
    assert job_row(db, job)["error_message"] == "reconcile_no_recovery"
    assert usage_status(db, job) == "refunded"


def test_sync_sweep_schedule_runs_the_sweep_every_five_minutes():
    schedule = project_defs.resolve_schedule_def("sync_sweep_schedule")
    assert schedule.cron_schedule == "*/5 * * * *"
    assert schedule.job_name == "sync_sweep_job"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_pipeline_wrapper_jobs_without_provider_kind_are_not_swept(db, instance, media_dir, sandbox):
    """Spec 9.1: pipeline wrappers never call a provider, so no provider_kind is expected."""
    user = make_user(db)
    wrapper = make_job(db, user, job_type="pipeline", created_minutes_ago=600)
    legacy = make_job(db, user, job_type="image", created_minutes_ago=600)

    assert _sweep(make_defs(media_dir), instance).success

    assert job_row(db, wrapper)["status"] == "processing"
    assert job_row(db, legacy)["status"] == "failed"
