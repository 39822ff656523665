"""On real PostgreSQL: no value a jobs row can hold stops
reconciliation. A timestamp Python cannot represent is read as NULL plus a flag everywhere; the
attempt counter saturates and never passes the cap; a lease no live run could hold is clamped to
the lease TTL; an error while claiming stays with its job."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from recon_dagster.db.jobs import load_job, scan_stale
from recon_dagster.operator.explain import explain_command, load_story, to_json, to_text
from recon_dagster.operator.status import kind_status, print_status
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_state, make_job, make_user, reserve, sql
from recon_dagster_tests.support.ledger import anomaly_reasons
from recon_dagster_tests.support.reconcile import make_defs, one, tick, usage_status

# Values PostgreSQL's timestamptz holds and Python's datetime cannot (year 1..9999 only).
UNREADABLE = ("0001-01-01 00:00:00+00 BC", "10000-01-01 00:00:00+00", "294276-12-31 00:00:00+00")
# Every timestamp column a jobs statement reads, compares or sorts on.
JOB_COLUMNS = (
    "provider_call_started_at",
    "created_at",
    "started_at",
    "reconcile_lease_expires_at",
    "reconcile_next_at",
    "updated_at",
    "completed_at",
)
INT_MAX = 2_147_483_647


def _good_jobs(db: sa.Engine, sandbox, user: uuid.UUID, n: int = 2) -> list[uuid.UUID]:
    jobs = []
    for _ in range(n):
        task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
        jobs.append(
            make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=11)
        )
    return jobs


@pytest.mark.parametrize("value", UNREADABLE)
@pytest.mark.parametrize("column", JOB_COLUMNS)
def test_a_timestamp_python_cannot_hold_is_read_as_null_plus_a_flag_everywhere(
    db, instance, media_dir, sandbox, column: str, value: str
):
    user = make_user(db, sub=100, topup=0)
    good = _good_jobs(db, sandbox, user)
    good_sync = make_job(db, user, provider_kind="anthropic-sync", started_minutes_ago=6)
    # Both routes: a recoverable async job and a sweep candidate, each with the poisoned column.
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    polled = make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=11)
    swept = make_job(db, user, provider_kind="elevenlabs-sync", started_minutes_ago=6)
    for j in (*good, good_sync, polled, swept):
        reserve(db, j, user, 5)
    for j in (polled, swept):
        sql(db, f"UPDATE jobs SET {column} = :v WHERE id = :j", v=value, j=j)

    with db.connect() as conn:  # every reader of job rows
        scan_stale(conn, 50)
        rows = [load_job(conn, j) for j in (polled, swept)]
        assert kind_status(conn)
    if column in ("provider_call_started_at", "created_at", "started_at", "reconcile_lease_expires_at"):
        assert all(getattr(r, column) is None and column in r.nonfinite for r in rows)
    report = tick(make_defs(media_dir), instance, sweep=True)

    assert report.summary.scanned >= 1
    for j in good:
        assert job_state(db, j)["status"] == "completed"
    assert (job_state(db, good_sync)["status"], usage_status(db, good_sync)) == ("failed", "refunded")
    for j in (polled, swept):
        assert explain_command(str(j)) == 0 and explain_command(str(j), as_json=True) == 0
        assert job_state(db, j)["status"] in ("processing", "completed", "failed")
    assert print_status() == 0


@pytest.mark.parametrize("value", UNREADABLE[:2])
@pytest.mark.parametrize(
    "table,column",
    [
        ("reconcile_events", "created_at"),
        ("usage_logs", "created_at"),
        ("usage_logs", "settled_at"),
        ("credit_anomalies", "created_at"),
        ("jobs", "completed_at"),
        ("jobs", "created_at"),
    ],
)
def test_explain_shows_a_timestamp_python_cannot_hold_as_unknown(
    db, instance, media_dir, sandbox, table: str, column: str, value: str
):
    user = make_user(db, sub=100, topup=0)
    job = make_job(db, user, provider_kind="anthropic-sync", started_minutes_ago=6)
    reserve(db, job, user, 5)
    sql(db, "UPDATE jobs SET completed_at = :v WHERE id = :j", v=value, j=job)
    tick(make_defs(media_dir), instance, sweep=True)
    sql(db, "INSERT INTO credit_anomalies (job_id, user_id, reason) VALUES (:j, :u, 'probe')", j=job, u=user)
    sql(
        db,
        f"UPDATE {table} SET {column} = :v WHERE {'id' if table == 'jobs' else 'job_id'} = :j",
        v=value,
        j=job,
    )

    story = load_story(db, job)

    assert str(job) in to_text(story, None) and to_json(story, None)["job_id"] == str(job)
    if table == "jobs":
        assert f"unreadable timestamps  {column}" in to_text(story, None)
        run = (
            make_defs(media_dir)
            .resolve_job_def("explain_job")
            .execute_in_process(
                run_config={"ops": {"explain_job_story": {"config": {"job_id": str(job)}}}}, instance=instance
            )
        )
        assert run.success


def test_the_attempt_counter_at_the_integer_max_is_exhausted_and_its_batch_mates_settle(
    db, instance, media_dir, sandbox
):
    user = make_user(db, sub=100, topup=0)
    good = _good_jobs(db, sandbox, user, 12)
    poisoned = make_job(
        db, user, provider_kind="kie-standard", provider_task_id="t-max", started_minutes_ago=11
    )
    for j in (*good, poisoned):
        reserve(db, j, user, 5)
    sql(db, "UPDATE jobs SET reconcile_attempts = :n WHERE id = :j", n=INT_MAX, j=poisoned)

    tick(make_defs(media_dir, single_run_below=2), instance, sweep=True)

    assert [job_state(db, j)["status"] for j in good] == ["completed"] * 12
    assert (job_state(db, poisoned)["status"], usage_status(db, poisoned)) == ("failed", "refunded")
    assert "reconcile_exhausted" in anomaly_reasons(db, poisoned)


def test_a_lease_takeover_at_the_integer_max_never_overflows(db, instance, media_dir, sandbox):
    user = make_user(db, sub=100, topup=0)
    good = _good_jobs(db, sandbox, user, 3)
    poisoned = make_job(
        db, user, provider_kind="kie-standard", provider_task_id="t-max", started_minutes_ago=11
    )
    for j in (*good, poisoned):
        reserve(db, j, user, 5)
    sql(
        db,
        "UPDATE jobs SET reconcile_attempts = :n, reconcile_lease_owner = 'dead-run', "
        "reconcile_lease_expires_at = now() - interval '1 second' WHERE id = :j",
        n=INT_MAX,
        j=poisoned,
    )

    tick(make_defs(media_dir, single_run_below=2), instance, sweep=True)

    assert [job_state(db, j)["status"] for j in good] == ["completed"] * 3
    assert (job_state(db, poisoned)["status"], usage_status(db, poisoned)) == ("failed", "refunded")


@pytest.mark.parametrize("attempts", [-1, -INT_MAX - 1])
def test_a_negative_attempt_counter_is_exhausted(db, instance, media_dir, sandbox, attempts: int):
    user = make_user(db, sub=100, topup=0)
    for route in ("poll", "sweep"):
        job = (
            make_job(db, user, provider_kind="kie-standard", provider_task_id="t-neg", started_minutes_ago=11)
            if route == "poll"
            else make_job(db, user, provider_kind="anthropic-sync", started_minutes_ago=6)
        )
        reserve(db, job, user, 5)
        sql(db, "UPDATE jobs SET reconcile_attempts = :n WHERE id = :j", n=attempts, j=job)

        tick(make_defs(media_dir), instance, sweep=True)

        assert (job_state(db, job)["status"], usage_status(db, job)) == ("failed", "refunded")
        assert "reconcile_exhausted" in anomaly_reasons(db, job)


@pytest.mark.parametrize("expiry", ["infinity", "10000-01-01 00:00:00+00", "now() + interval '30 days'"])
def test_a_lease_no_live_run_could_hold_expires_after_the_lease_ttl_with_an_anomaly(
    db, instance, media_dir, sandbox, expiry: str
):
    user = make_user(db, sub=100, topup=0)
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=11)
    reserve(db, job, user, 5)
    when = expiry if expiry.startswith("now()") else f"'{expiry}'"
    sql(db, f"UPDATE jobs SET reconcile_lease_owner = 'stuck-run', reconcile_lease_expires_at = {when} WHERE id = :j",
        j=job)  # fmt: skip
    defs = make_defs(media_dir, lease_seconds=1)

    tick(defs, instance, sweep=True)

    assert "lease_beyond_ttl" in anomaly_reasons(db, job)
    assert one(
        db, "SELECT reconcile_lease_expires_at <= now() + interval '1 second' FROM jobs WHERE id = :j", j=job
    )
    sql(db, "UPDATE jobs SET reconcile_lease_expires_at = now() - interval '1 ms' WHERE id = :j", j=job)
    tick(defs, instance, sweep=True)  # the clamped lease has run out: taken over like a dead run's
    assert job_state(db, job)["status"] == "completed"


def test_an_error_while_claiming_stays_with_its_job(db, instance, media_dir, sandbox):
    user = make_user(db, sub=100, topup=0)
    good = _good_jobs(db, sandbox, user, 5)
    bad = make_job(db, user, provider_kind="kie-standard", provider_task_id="t-bad", started_minutes_ago=11)
    for j in (*good, bad):
        reserve(db, j, user, 5)
    # A row whose claim itself raises (here a trigger; in the field a value the statement chokes on).
    with db.begin() as conn:
        conn.exec_driver_sql(
            f"""
            CREATE FUNCTION poison_claim() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF NEW.id = '{bad}' AND NEW.reconcile_lease_owner IS NOT NULL THEN
                RAISE EXCEPTION 'poisoned row';
              END IF;
              RETURN NEW;
            END $$;
            CREATE TRIGGER poison_claim BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION poison_claim();
            """
        )
    try:
        tick(make_defs(media_dir, single_run_below=2), instance, sweep=True)
    finally:
        with db.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER poison_claim ON jobs; DROP FUNCTION poison_claim()")

    assert [job_state(db, j)["status"] for j in good] == ["completed"] * 5
    assert job_state(db, bad)["status"] == "processing"
    assert one(db, "SELECT count(*) FROM reconcile_events WHERE job_id = :j AND outcome = 'error' "
               "AND detail LIKE '%poisoned row%'", j=bad) >= 1  # fmt: skip


def test_the_attempt_counter_never_exceeds_the_cap_when_the_force_fail_raises(
    db, instance, media_dir, sandbox
):
    user = make_user(db, sub=100, topup=0)
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t-cap", started_minutes_ago=11)
    reserve(db, job, user, 5)
    # The refund would push the pool past numeric(14,4): every force-fail raises.
    sql(db, "UPDATE user_credits SET subscription_credits = 9999999999.9999 WHERE user_id = :u", u=user)
    defs = make_defs(media_dir, max_attempts=18)
    sql(db, "UPDATE jobs SET reconcile_attempts = 17, reconcile_lease_owner = 'dead-run', "
        "reconcile_lease_expires_at = now() - interval '1 second' WHERE id = :j", j=job)  # fmt: skip

    seen = []
    for _ in range(4):  # each pass: the lease of the run before expired, taken over again
        tick(defs, instance, sweep=True)
        seen.append(job_state(db, job)["reconcile_attempts"])
        sql(db, "UPDATE jobs SET reconcile_lease_expires_at = now() - interval '1 second', "
            "reconcile_next_at = NULL WHERE id = :j AND reconcile_lease_owner IS NOT NULL", j=job)  # fmt: skip

    assert max(seen) <= 18, seen
    assert job_state(db, job)["status"] == "processing" and usage_status(db, job) == "reserved"
    assert one(db, "SELECT count(*) FROM credit_anomalies WHERE job_id = :j AND reason = 'reconcile_settle_error'",
               j=job) == 1  # fmt: skip


def test_bump_never_overflows_the_counter(db):
    from recon_dagster.db.jobs import bump_attempts

    user = make_user(db)
    job = make_job(db, user)
    sql(db, "UPDATE jobs SET reconcile_attempts = :n WHERE id = :j", n=INT_MAX, j=job)
    with db.begin() as conn:
        n = bump_attempts(conn, job, expected_attempts=INT_MAX, last_error="x", next_in=timedelta(0))
    assert n == INT_MAX
