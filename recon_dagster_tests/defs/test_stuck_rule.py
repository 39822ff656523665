"""``stuck_jobs`` lists only jobs that are really stuck (issue 55, item 6).

The rule (``StuckRule``): an in-flight job past its kind's stale threshold runs as it should, and
is not listed, while its newest attempt got the provider's answer that the task still runs, that
answer is under two cadences old, and it has more than 2 attempts before the cap; a job not
worked yet is fine for two cadences past its threshold. Every other one is stuck and says why.
Checked over every variant of the last attempt (outcome, cause, age), the attempt count and the
events that say nothing of the job (an operator's action, a poll our limiter kept in), on a real
PostgreSQL; and through real reconcile runs against the sandbox.
"""

from __future__ import annotations

import uuid

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import KINDS, MAX_ATTEMPTS
from recon_dagster.defs.observe.stuck import StuckRule, stuck_counts, stuck_rows
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import make_job, make_user
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick

pytestmark = pytest.mark.postgres

RULE = StuckRule(cap=MAX_ATTEMPTS, cadence_s=300)  # two cadences: 10 minutes
KIND = "replicate-prediction"
THRESHOLD_MIN = KINDS[KIND].stale_threshold.total_seconds() / 60


def _job(db, user, *, attempts: int, past_threshold_min: float = 60, status: str = "processing") -> uuid.UUID:
    job = make_job(
        db, user, provider_kind=KIND, provider_task_id=f"t-{uuid.uuid4().hex[:12]}",
        started_minutes_ago=THRESHOLD_MIN + past_threshold_min, reconcile_attempts=attempts,
    )  # fmt: skip
    if status != "processing":
        with db.begin() as conn:
            conn.execute(sa.text("UPDATE jobs SET status = :s WHERE id = :j"), {"s": status, "j": str(job)})
    return job


def _event(db, job: uuid.UUID, outcome: str, cause: str | None, minutes_ago: float) -> None:
    with db.begin() as conn:
        conn.execute(
            sa.text(
                """
                INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome, detail, run_key, cause,
                                              created_at)
                VALUES (:j, :k, 1, :o, 'test', 'test', :c, now() - make_interval(secs => :s))
                """
            ),
            {"j": str(job), "k": KIND, "o": outcome, "c": cause, "s": minutes_ago * 60},
        )


def _listed(db) -> dict[str, dict]:
    with db.connect() as conn:
        return {r["job_id"]: r for r in stuck_rows(conn, rule=RULE)}


# (attempts, events oldest first as (outcome, cause, minutes ago)) -> the reason it is stuck, or None
CASES = {
    "answered running just now": (3, [("still_running", "answered", 1)], None),
    "answered running 9 min ago": (3, [("still_running", "answered", 9)], None),
    "answered running 11 min ago: not polled since": (3, [("still_running", "answered", 11)], "not polled since"),
    "no answer just now": (3, [("error", "provider", 1)], "did not answer its last poll"),
    "answered, then no answer": (3, [("still_running", "answered", 5), ("error", "provider", 1)], "did not answer"),
    "no answer, then answered": (3, [("error", "provider", 5), ("still_running", "answered", 1)], None),
    "unusable result": (3, [("error", "job", 1)], "not usable"),
    "our fault": (3, [("our_fault", "internal", 1)], "ended our_fault"),
    "3 attempts left, running": (MAX_ATTEMPTS - 3, [("still_running", "answered", 1)], None),
    "2 attempts left, running": (MAX_ATTEMPTS - 2, [("still_running", "answered", 1)], "before the cap"),
    "1 attempt left, running": (MAX_ATTEMPTS - 1, [("still_running", "answered", 1)], "before the cap"),
    "an operator's retry after the answer": (
        3, [("still_running", "answered", 2), ("operator_retry", None, 1)], None,
    ),
    "our limiter kept the next poll in": (3, [("still_running", "answered", 2), ("not_sent", "not_asked", 1)], None),
    "limiter only, the last answer old": (
        3, [("still_running", "answered", 30), ("not_sent", "not_asked", 1)], "not polled since",
    ),
    "lost a race after the answer": (3, [("still_running", "answered", 2), ("lost_race", None, 1)], None),
    "attempts counted, none on record": (3, [], "none on record"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_a_job_is_listed_only_when_really_stuck(db, case):
    attempts, events, why = CASES[case]
    job = _job(db, make_user(db), attempts=attempts)
    for outcome, cause, ago in events:
        _event(db, job, outcome, cause, ago)

    rows = _listed(db)

    if why is None:
        assert str(job) not in rows, rows.get(str(job))
    else:
        assert why in rows[str(job)]["why"], rows[str(job)]


@pytest.mark.parametrize(("past_threshold_min", "stuck"), [(1, False), (9, False), (11, True), (120, True)])
def test_a_job_not_worked_yet_is_stuck_two_cadences_past_its_threshold(db, past_threshold_min, stuck):
    job = _job(db, make_user(db), attempts=0, past_threshold_min=past_threshold_min)
    rows = _listed(db)
    assert (str(job) in rows) is stuck
    if stuck:
        assert "not reached" in rows[str(job)]["why"]


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_an_ended_job_is_never_stuck(db, status):
    job = _job(db, make_user(db), attempts=MAX_ATTEMPTS - 1, status=status)
    _event(db, job, "error", "provider", 30)
    assert str(job) not in _listed(db)


def test_the_counts_match_the_rule_and_the_healthy_are_counted_apart(db):
    with db.begin() as conn:
        conn.exec_driver_sql("TRUNCATE jobs, reconcile_events RESTART IDENTITY CASCADE")
    user = make_user(db)
    expected_stuck, expected_fine = 0, 0
    for attempts, events, why in CASES.values():
        job = _job(db, user, attempts=attempts)
        for outcome, cause, ago in events:
            _event(db, job, outcome, cause, ago)
        expected_stuck += why is not None
        expected_fine += why is None
    with db.connect() as conn:
        assert stuck_counts(conn, RULE) == (expected_stuck, expected_fine)
        assert len(stuck_rows(conn, rule=RULE)) == expected_stuck


@pytest.mark.slow
def test_through_reconcile_runs_a_running_job_is_not_stuck_and_a_down_one_is(
    db, instance, media_dir, sandbox
):
    _, running, _ = stale_job_with_task(db, sandbox, KIND, Scenario(outcome="run_forever"), attempts=3)
    _, down, _ = stale_job_with_task(db, sandbox, KIND, Scenario(server_error_first=1_000_000), attempts=3)
    defs = make_defs(media_dir, single_run_below=5)

    tick(defs, instance)

    rows = _listed(db)
    assert str(running) not in rows
    assert "did not answer its last poll" in rows[str(down)]["why"]
    meta = instance.get_latest_materialization_event(dg.AssetKey("stuck_jobs")).asset_materialization.metadata
    listed = {r.data["job_id"] for r in meta["table"].value.records}
    assert str(down) in listed and str(running) not in listed
    assert meta["running_fine"].value >= 1
    # Nobody polls it for two cadences: now it is stuck.
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE reconcile_events SET created_at = created_at - interval '11 minutes' WHERE job_id = :j"
            ),
            {"j": str(running)},
        )
    assert "not polled since" in _listed(db)[str(running)]["why"]


@pytest.mark.parametrize(("minutes_ago", "stuck"), [(0.5, False), (1.9, False), (2.5, True)])
def test_at_a_short_cadence_a_job_polled_within_two_minutes_is_not_stuck(db, minutes_ago, stuck):
    """A sensor tick and a run's launch take their time: at a 10 s cadence the grace is 2 minutes."""
    short = StuckRule(cap=MAX_ATTEMPTS, cadence_s=10)
    job = _job(db, make_user(db), attempts=3)
    _event(db, job, "still_running", "answered", minutes_ago)
    with db.connect() as conn:
        listed = {r["job_id"] for r in stuck_rows(conn, rule=short)}
    assert (str(job) in listed) is stuck
