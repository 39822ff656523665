"""Async recovery through Dagster (sensor + reconcile_job): a stale job whose upstream task finished,
failed or is still running is completed with its media, refunded, or left for the next attempt up
to the cap, for every async family; against real PostgreSQL and the loopback provider sandbox over real HTTP."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import MAX_ATTEMPTS
from recon_dagster.core.runtags import ATTEMPT_TAG, tagged_job_ids
from recon_dagster.db.engine import libpq_url
from recon_dagster.defs.reconcile.sensors import read_cursor
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import balances, job_row, make_job, make_user
from recon_dagster_tests.support.reconcile import (
    count,
    evaluate_sensor,
    make_defs,
    one,
    stale_job_with_task,
    tick,
    usage_status,
)


def _files(media_dir: str) -> list[Path]:
    return sorted(p for p in Path(media_dir).rglob("*") if p.is_file())


def test_kie_success_recovers_the_job_with_media_credits_asset_and_event(
    db, engine, instance, media_dir, sandbox, database_url
):
    user, job, task = stale_job_with_task(db, sandbox, "kie-standard")
    listener = psycopg.connect(libpq_url(database_url), autocommit=True)
    listener.execute("LISTEN job_events")

    report = tick(make_defs(media_dir), instance)

    assert report.runs == 1 and report.failed_runs == 0
    row = job_row(db, job)
    assert row["status"] == "completed"
    assert row["progress"] == 100
    assert row["output_data"]["finalized_by"] == "reconcile"
    assert usage_status(db, job) == "committed"
    assert balances(db, user) == (Decimal(80), Decimal(40))  # spent once, not refunded
    assert count(db, "assets", job) == 1
    files = _files(media_dir)
    assert len(files) == 1 and str(job) in str(files[0])
    assert sandbox.poll_count(task) >= 1
    assert sandbox.create_count() == 0  # reconciliation never creates upstream tasks
    events = [json.loads(n.payload) for n in listener.notifies(timeout=1, stop_after=1)]
    assert events == [{"job_id": str(job), "status": "completed", "source": "reconcile"}]
    listener.close()


def test_kie_failure_marks_failed_and_refunds_to_the_right_pools(db, instance, media_dir, sandbox):
    user, job, _ = stale_job_with_task(
        db, sandbox, "kie-standard", Scenario(outcome="fail", polls_before_done=0)
    )

    tick(make_defs(media_dir), instance)

    row = job_row(db, job)
    assert row["status"] == "failed"
    assert row["error_message"].startswith("reconcile: upstream failed")
    assert usage_status(db, job) == "refunded"
    assert balances(db, user) == (Decimal(100), Decimal(50))
    assert count(db, "assets", job) == 0


def test_kie_still_processing_bumps_attempts_once_and_waits_for_the_cadence(db, instance, media_dir, sandbox):
    _, job, _ = stale_job_with_task(db, sandbox, "kie-standard", Scenario(outcome="run_forever"))
    defs = make_defs(media_dir)

    tick(defs, instance)
    row = job_row(db, job)
    assert row["status"] == "processing"
    assert row["reconcile_attempts"] == 1
    assert "still running" in row["reconcile_last_error"]
    assert usage_status(db, job) == "reserved"

    again = tick(defs, instance)  # within the 5-minute cadence: not due
    assert again.runs == 0
    assert job_row(db, job)["reconcile_attempts"] == 1


@pytest.mark.parametrize(
    ("kind", "job_type", "scenario"),
    [
        ("kie-veo", "video", Scenario(polls_before_done=0)),
        ("kie-suno", "audio", Scenario(polls_before_done=0)),
        ("kie-kontext", "image", Scenario(polls_before_done=0)),
        ("kie-luma", "video", Scenario(polls_before_done=0, luma_callback_failed=True)),
        ("kie-kling3", "video", Scenario(polls_before_done=0)),
        ("kie-runway", "video", Scenario(polls_before_done=0)),
        ("kie-lip-sync", "video", Scenario(polls_before_done=0)),
        ("replicate-prediction", "image", Scenario(polls_before_done=0)),
        ("elevenlabs-async", "audio", Scenario(polls_before_done=0)),
    ],
)
def test_every_async_family_recovers(db, instance, media_dir, sandbox, kind, job_type, scenario):
    _, job, task = stale_job_with_task(db, sandbox, kind, scenario, job_type=job_type)

    report = tick(make_defs(media_dir), instance)

    assert report.failed_runs == 0
    assert job_row(db, job)["status"] == "completed", job_row(db, job)["reconcile_last_error"]
    assert usage_status(db, job) == "committed"
    assert count(db, "assets", job) == 1
    assert sandbox.poll_count(task) >= 1
    assert _files(media_dir)


def test_replicate_training_recovery_marks_the_character_ready(db, instance, media_dir, sandbox):
    user, job, task = stale_job_with_task(db, sandbox, "replicate-training", job_type="lora-training")
    with db.begin() as conn:
        char = conn.execute(
            sa.text(
                "INSERT INTO characters (user_id, name, training_status, replicate_training_id, training_job_id) "
                "VALUES (:u, 'c', 'training', :t, :j) RETURNING id"
            ),
            {"u": str(user), "t": task, "j": str(job)},
        ).scalar_one()

    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "completed"
    assert one(db, "SELECT training_status FROM characters WHERE id = :c", c=char) == "ready"
    assert one(db, "SELECT lora_weights_url FROM characters WHERE id = :c", c=char)


def test_replicate_data_removed_fails_and_refunds(db, instance, media_dir, sandbox):
    user, job, _ = stale_job_with_task(
        db, sandbox, "replicate-prediction", Scenario(polls_before_done=0, data_removed=True)
    )

    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "failed"
    assert "expired" in job_row(db, job)["error_message"]
    assert balances(db, user) == (Decimal(100), Decimal(50))


def test_attempt_cap_force_fails_refunds_and_logs_an_anomaly(db, instance, media_dir, sandbox):
    user, job, _ = stale_job_with_task(
        db, sandbox, "kie-standard", Scenario(outcome="run_forever"), attempts=MAX_ATTEMPTS - 1
    )

    tick(make_defs(media_dir), instance)

    row = job_row(db, job)
    assert row["status"] == "failed"
    assert row["error_message"].startswith("reconcile_exhausted")
    assert row["reconcile_attempts"] == MAX_ATTEMPTS
    assert usage_status(db, job) == "refunded"
    assert balances(db, user) == (Decimal(100), Decimal(50))
    assert one(db, "SELECT reason FROM credit_anomalies WHERE job_id = :j", j=job) == "reconcile_exhausted"


def test_expired_media_url_bumps_attempts_never_false_completes_then_force_fails(
    db, instance, media_dir, sandbox
):
    _, job, _ = stale_job_with_task(
        db, sandbox, "kie-standard", Scenario(polls_before_done=0, media_status=403)
    )
    defs = make_defs(media_dir, cadence_seconds=0)

    tick(defs, instance)
    row = job_row(db, job)
    assert row["status"] == "processing"
    assert row["reconcile_attempts"] == 1
    assert "MediaExpired" in row["reconcile_last_error"]
    assert _files(media_dir) == []

    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET reconcile_attempts = :n WHERE id = :j"),
            {"n": MAX_ATTEMPTS - 1, "j": str(job)},
        )
    tick(defs, instance)
    assert job_row(db, job)["status"] == "failed"
    assert usage_status(db, job) == "refunded"


def test_is_public_null_defaults_to_public_and_row_value_is_honoured(db, instance, media_dir, sandbox):
    _, public_job, _ = stale_job_with_task(db, sandbox, "kie-standard", is_public=None)
    _, private_job, _ = stale_job_with_task(db, sandbox, "kie-standard", is_public=False)

    tick(make_defs(media_dir), instance)

    assert one(db, "SELECT is_public FROM assets WHERE job_id = :j", j=public_job) is True
    assert one(db, "SELECT is_public FROM assets WHERE job_id = :j", j=private_job) is False


def test_watermark_follows_the_rows_should_watermark(db, instance, media_dir, sandbox):
    _, marked, _ = stale_job_with_task(db, sandbox, "kie-standard", should_watermark=True)
    _, clean, _ = stale_job_with_task(db, sandbox, "kie-standard", should_watermark=False)

    tick(make_defs(media_dir), instance)

    marked_keys = one(db, "SELECT storage_key FROM assets WHERE job_id = :j", j=marked)
    clean_keys = one(db, "SELECT storage_key FROM assets WHERE job_id = :j", j=clean)
    assert ".watermarked." in marked_keys
    assert ".watermarked." not in clean_keys
    # Only the watermarked variant is stored: no clean original to find.
    assert Path(media_dir, marked_keys).is_file()
    assert not Path(media_dir, marked_keys.replace(".watermarked", "")).exists()


def test_sensor_requests_partitioned_runs_with_deterministic_keys_and_tags(db, instance, media_dir, sandbox):
    _, job, _ = stale_job_with_task(db, sandbox, "replicate-prediction")
    defs = make_defs(media_dir)

    result = evaluate_sensor(defs, instance)

    [rr] = result.run_requests
    assert rr.partition_key == "replicate-prediction"
    assert rr.run_key == f"{job}:1"
    assert tagged_job_ids(rr.tags) == {str(job)}
    assert rr.tags["recon/provider_kind"] == "replicate-prediction"
    assert rr.tags[ATTEMPT_TAG] == "1"
    # Nothing is leased by the sensor: a second tick plans the same attempt under the same key,
    # which Dagster never launches twice.
    assert [r.run_key for r in evaluate_sensor(defs, instance).run_requests] == [rr.run_key]


def test_sensor_packs_a_backlog_into_batches_and_drains_it(db, instance, media_dir, sandbox):
    jobs = [stale_job_with_task(db, sandbox, "kie-veo", job_type="video")[1] for _ in range(25)]
    defs = make_defs(media_dir, batch_size=10, single_run_below=5)

    report = tick(defs, instance)

    assert report.runs == 3
    assert report.failed_runs == 0
    assert all(job_row(db, j)["status"] == "completed" for j in jobs)


def test_sensor_skips_with_a_reason_and_survives_a_bad_row(db, instance, media_dir, sandbox):
    user = make_user(db)
    weird = make_job(db, user, provider_kind="no-such-kind", provider_task_id="t-1", started_minutes_ago=60)
    defs = make_defs(media_dir)

    result = evaluate_sensor(defs, instance)

    assert result.run_requests == []
    assert "leftToSweep=1" in result.skip_message
    # The sweep takes the unknown kind: failed, never crashed.
    tick(defs, instance, sweep=True)
    assert job_row(db, weird)["status"] == "failed"


def test_an_unexpected_poll_error_is_recorded_as_an_attempt(db, instance, media_dir, sandbox):
    _, job, _ = stale_job_with_task(
        db, sandbox, "kie-standard", Scenario(polls_before_done=0, malformed=True)
    )

    tick(make_defs(media_dir), instance)

    row = job_row(db, job)
    assert row["status"] == "processing"
    assert row["reconcile_attempts"] == 1
    assert "ProviderProtocolError" in row["reconcile_last_error"]
    assert one(db, "SELECT outcome FROM reconcile_events WHERE job_id = :j", j=job) == "error"


def test_sensor_tick_reports_the_outcomes_of_runs_since_its_previous_tick(db, instance, media_dir, sandbox):
    stale_job_with_task(db, sandbox, "kie-standard")
    stale_job_with_task(
        db, sandbox, "kie-veo", Scenario(outcome="fail", polls_before_done=0), job_type="video"
    )
    stale_job_with_task(db, sandbox, "kie-suno", Scenario(outcome="run_forever"), job_type="audio")
    defs = make_defs(media_dir)
    before = str(time.time() - 1)

    tick(defs, instance)
    result = evaluate_sensor(defs, instance, cursor=before)

    assert result.run_requests == []
    assert "[reconcile] scanned=0 recovered=1 failed=1 stillRunning=1 errors=0" in result.skip_message
    # The cursor of an older release (a bare float, as ``before``) is read; the new one is readable.
    assert json.loads(result.cursor)["previous_tick"].startswith(time.strftime("%Y-", time.gmtime()))
    assert (read_cursor(result.cursor) or 0) > float(before)


def test_the_sensor_cursor_is_an_iso_timestamp_and_old_float_cursors_still_read():
    from recon_dagster.defs.reconcile.sensors import write_cursor

    at = 1_796_163_058.123456
    assert write_cursor(at) == '{"previous_tick": "2026-12-01T22:10:58.123456+00:00"}'
    assert read_cursor(write_cursor(at)) == pytest.approx(at, abs=1e-6)
    assert read_cursor(str(at)) == at  # the bare float of older releases
    assert read_cursor('{"previous_tick": "2026-12-01T22:10:58"}') == pytest.approx(at - 0.123456)
    for unreadable in (None, "", "yesterday", "{}", '{"previous_tick": 3}', "[1]"):
        assert read_cursor(unreadable) is None, unreadable
