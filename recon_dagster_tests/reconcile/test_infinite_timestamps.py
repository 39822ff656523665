"""A timestamp at +/-infinity in a jobs row (which PostgreSQL stores and Python cannot load) never
stops the scan, the sweep, a sensor tick or ``reconcile --once``: the row is isolated, flagged and,
at the attempt cap, failed and refunded, while the good rows beside it are reconciled. Real
PostgreSQL."""

from __future__ import annotations

from decimal import Decimal

from recon_dagster.core.runtags import tagged_job_ids
from recon_dagster.db.jobs import load_job, scan_stale
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import (
    balances,
    job_state,
    make_job,
    make_user,
    reserve,
    sql,
)
from recon_dagster_tests.support.ledger import anomaly_reasons
from recon_dagster_tests.support.reconcile import evaluate_sensor, make_defs, tick, usage_status

D = Decimal


def test_rows_with_infinite_timestamps_are_isolated_and_good_rows_reconciled(
    db, instance, media_dir, sandbox
):
    user = make_user(db, sub=100, topup=0)
    good_task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    good = make_job(
        db, user, provider_kind="kie-standard", provider_task_id=good_task, started_minutes_ago=11
    )
    good_sync = make_job(db, user, provider_kind="anthropic-sync", started_minutes_ago=6)
    # A recoverable job whose call time is -infinity: its poll answer is still the truth.
    bad_task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    minus_call = make_job(db, user, provider_kind="kie-standard", provider_task_id=bad_task)
    sql(db, "UPDATE jobs SET provider_call_started_at = '-infinity' WHERE id = :j", j=minus_call)
    # Sweep candidates whose age cannot be known: never swept on it, counted instead.
    minus_created = make_job(db, user)
    sql(db, "UPDATE jobs SET created_at = '-infinity' WHERE id = :j", j=minus_created)
    minus_sync = make_job(db, user, provider_kind="elevenlabs-sync")
    sql(db, "UPDATE jobs SET provider_call_started_at = '-infinity', started_at = 'infinity' WHERE id = :j",
        j=minus_sync)  # fmt: skip
    plus_started = make_job(db, user, created_minutes_ago=600)
    sql(db, "UPDATE jobs SET started_at = 'infinity' WHERE id = :j", j=plus_started)
    plus_call = make_job(db, user, provider_kind="kie-standard", provider_task_id="t-plus")
    sql(db, "UPDATE jobs SET provider_call_started_at = 'infinity' WHERE id = :j", j=plus_call)
    for j in (good, good_sync, minus_call, minus_created, minus_sync, plus_started, plus_call):
        reserve(db, j, user, 5)

    with db.connect() as conn:  # the scan itself reads them
        scanned = {r.id: r for r in scan_stale(conn, 50)}
        assert load_job(conn, plus_call).nonfinite == ("provider_call_started_at",)
    assert scanned[minus_created].nonfinite == ("created_at",) and scanned[minus_created].created_at is None
    report = tick(make_defs(media_dir), instance, sweep=True)

    # The one-job run of the unprocessable elevenlabs-sync row errored on its only job: such a run
    # fails on purpose (an outage is loud); every other run, and the tick, went on.
    assert report.failed_runs == 1
    assert job_state(db, good)["status"] == "completed"
    assert (job_state(db, good_sync)["status"], usage_status(db, good_sync)) == ("failed", "refunded")
    assert job_state(db, minus_call)["status"] == "completed"
    assert "nonfinite_timestamp" in anomaly_reasons(db, minus_call)
    for j in (minus_created, minus_sync):
        row = job_state(db, j)
        assert (row["status"], row["reconcile_attempts"]) == ("processing", 1)
        assert "non-finite" in row["reconcile_last_error"]
        assert usage_status(db, j) == "reserved"
        assert anomaly_reasons(db, j) == ["nonfinite_timestamp"]
    for j in (plus_started, plus_call):  # never due: not stuck yet as far as anyone can tell
        assert (job_state(db, j)["status"], job_state(db, j)["reconcile_attempts"]) == ("processing", 0)


def test_a_sensor_tick_survives_an_infinite_call_time(db, instance, media_dir, sandbox):
    user = make_user(db)
    bad = make_job(db, user, provider_kind="kie-veo", provider_task_id="t-inf")
    sql(db, "UPDATE jobs SET provider_call_started_at = '-infinity' WHERE id = :j", j=bad)
    good = make_job(db, user, provider_kind="kie-standard", provider_task_id="t-ok", started_minutes_ago=11)

    result = evaluate_sensor(make_defs(media_dir), instance)

    assert {j for rr in result.run_requests for j in tagged_job_ids(rr.tags)} == {str(bad), str(good)}


def test_an_exhausted_row_with_an_infinite_age_is_failed_and_refunded_at_the_cap(
    db, instance, media_dir, sandbox
):
    user = make_user(db, sub=10, topup=0)
    job = make_job(db, user, reconcile_attempts=17)
    sql(db, "UPDATE jobs SET created_at = '-infinity' WHERE id = :j", j=job)
    reserve(db, job, user, 10)

    tick(make_defs(media_dir), instance, sweep=True)

    assert (job_state(db, job)["status"], usage_status(db, job)) == ("failed", "refunded")
    assert balances(db, user) == (D(10), D(0))
    assert set(anomaly_reasons(db, job)) == {"nonfinite_timestamp", "reconcile_exhausted"}
