"""The sweep reads sweepable rows on their own, so an older backlog of async rows
(which only the sensor's polls can settle) never fills its batch and hides legacy or sync rows."""

from __future__ import annotations

import json
import uuid
from typing import Any

import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.decide import Outcome, Route, route
from recon_dagster.reconcile.reconciler import Reconciler
from recon_dagster_tests.support.factories import bulk_jobs, job_row, make_job, make_user, reserve
from recon_dagster_tests.support.plans import index_of, plan_nodes
from recon_dagster_tests.support.reconcile import usage_status

BACKLOG = 650  # more than the sweep's batch of 500


def _async_backlog(db: sa.Engine, n: int) -> None:
    """``n`` stale async rows with task ids, older than anything sweepable below."""
    with db.begin() as conn:
        conn.execute(
            sa.text(
                """
                INSERT INTO jobs (user_id, job_type, status, provider_kind, provider_task_id,
                                  provider_call_started_at, created_at)
                SELECT CAST(:u AS uuid), 'video', 'processing',
                       (ARRAY['kie-veo', 'replicate-prediction', 'elevenlabs-async'])[1 + g % 3],
                       'backlog-' || g, now() - interval '20 hours' + g * interval '1 second',
                       now() - interval '21 hours'
                FROM generate_series(1, :n) AS g
                """
            ),
            {"u": str(make_user(db)), "n": n},
        )


def _sweepable(db: sa.Engine) -> list[uuid.UUID]:
    """One of each sweepable shape, all younger than the backlog, each with a reservation."""
    user = make_user(db, sub=1000)
    made = [
        make_job(db, user, provider_kind="kie-llm", started_minutes_ago=6 * 60),  # sync kind
        make_job(db, user, provider_kind="anthropic-sync", started_minutes_ago=7 * 60),
        make_job(db, user, created_minutes_ago=5 * 60),  # legacy: no kind, no call time
        make_job(db, user, provider_kind="replicate-prediction", started_minutes_ago=6 * 60),  # no task id
        make_job(db, user, provider_kind="gone-kind", provider_task_id="t-1", started_minutes_ago=6 * 60),
        make_job(db, user, provider_kind="kie-llm", provider_task_id="t-2", started_minutes_ago=8 * 60),
        make_job(
            db, user, provider_kind="kie-veo", provider_task_id="", started_minutes_ago=6 * 60
        ),  # empty id
    ]
    for job in made:
        reserve(db, job, user, 5)
    return made


def test_sweep_is_never_starved_by_an_older_async_backlog(db, media_dir):
    _async_backlog(db, BACKLOG)
    sweepable = _sweepable(db)
    rec = Reconciler(db, providers_from_env(), LocalMediaStore(base_dir=media_dir))

    _, outcomes = rec.sweep_stale(f"sweep-{uuid.uuid4().hex[:8]}", limit=500)

    by_job = {o.job_id: o.outcome for o in outcomes}
    assert {by_job.get(j) for j in sweepable} == {Outcome.SWEPT}, by_job
    for job in sweepable:
        assert job_row(db, job)["status"] == "failed" and usage_status(db, job) == "refunded"
    # The backlog is the sensor's: the sweep neither touched nor leased it.
    with db.connect() as conn:
        untouched = conn.execute(
            sa.text(
                "SELECT count(*) FROM jobs WHERE provider_task_id LIKE 'backlog-%' AND status = 'processing' "
                "AND reconcile_attempts = 0 AND reconcile_lease_owner IS NULL"
            )
        ).scalar_one()
    assert untouched == BACKLOG


def test_sweep_scan_reads_exactly_the_sweepable_due_rows(db):
    # The sweep's own query selects the rows route() sends to the sweep among what the stale scan
    # finds due, no others (the Python filter stays the one source of truth; this keeps them equal).
    bulk_jobs(db, 3000, inflight_fraction=0.05, legacy_inflight=30)
    _sweepable(db)
    with db.connect() as conn:
        due = jobs_db.scan_stale(conn, limit=100_000)
        swept = jobs_db.scan_sweepable(conn, limit=100_000)
    assert {r.id for r in swept} == {r.id for r in due if route(r) is Route.SWEEP}
    assert swept and all(route(r) is Route.SWEEP for r in swept)


def _explain_sweep(conn: sa.Connection) -> list[dict[str, Any]]:
    raw = conn.execute(
        sa.text("EXPLAIN (FORMAT JSON) " + jobs_db.sweep_scan_sql()), {"limit": 500}
    ).scalar_one()
    plan = raw if isinstance(raw, list) else json.loads(raw)
    return plan_nodes(plan[0]["Plan"])


def test_sweep_scan_stays_on_an_index(db):
    bulk_jobs(db, 5000, inflight_fraction=0.01, legacy_inflight=20)
    _async_backlog(db, BACKLOG)
    with db.begin() as conn:
        conn.exec_driver_sql("ANALYZE jobs")
        on_jobs = [n for n in _explain_sweep(conn) if n.get("Relation Name") == "jobs"]
        assert on_jobs, "the plan reads no jobs relation at all"
        used = {index_of(n) for n in on_jobs}
        assert used <= {"jobs_taskless_inflight_idx", "jobs_inflight_idx"}, used
        assert "jobs_taskless_inflight_idx" in used
        assert jobs_db.scan_sweepable(conn, limit=500)
