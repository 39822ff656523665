"""The attempt cap holds while runs keep dying on a job: each takeover of a dead run's lease counts
an attempt, and the one that reaches the cap fails and refunds the job with an anomaly.

An invariant the fault harness or the state machine once broke is pinned here as a plain test (an
open one as ``xfail(strict=True)``, which fails the day the fix lands)."""

from __future__ import annotations

import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.reconcile.batches import next_attempt
from recon_dagster.reconcile.reconciler import Reconciler, ReconcileSettings
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import usage_status

SETTINGS = ReconcileSettings(max_attempts=4)


def _run_dies_after_claiming(db: sa.Engine, owner: str) -> int:
    """One sensor tick plans every due job, its run claims them when it starts (force-failing a
    takeover at the cap) and dies; time passes past the lease."""
    with db.connect() as conn:
        rows = jobs_db.scan_stale(conn, 100)
    reconciler = Reconciler(db, _NoPoll(), store=None, settings=SETTINGS)  # type: ignore[arg-type]
    work, settled = reconciler.claim([jobs_db.Claim(r.id, next_attempt(r)) for r in rows], owner)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_lease_expires_at = reconcile_lease_expires_at - interval '16 minutes'"
                " WHERE reconcile_lease_expires_at IS NOT NULL"
            )
        )
    return len(work) + len(settled)


class _NoPoll:
    """The dying runs never get as far as polling."""

    def poll(self, kind: str, task_id: str):
        raise AssertionError("a dying run never polls")

    def media_headers(self, kind, ref):
        return {}


# Found by the state machine's full profile (seed 20261130): a lease takeover counted an attempt
# but only a surviving run checked the cap. Fixed by the claim step (Reconciler.claim).
def test_attempts_stay_capped_while_runs_keep_dying_on_a_job(db: sa.Engine) -> None:
    user = make_user(db)
    job = make_job(
        db, user, provider_kind="kie-standard", provider_task_id="never-polled", started_minutes_ago=60
    )
    reserve(db, job, user, 10)
    for i in range(2 * SETTINGS.max_attempts):
        assert _run_dies_after_claiming(db, f"dying-run-{i}") <= 1
    row = job_row(db, job)
    # The cap holds: the takeover that reached it failed and refunded the job, with the anomaly.
    assert row["reconcile_attempts"] == SETTINGS.max_attempts, row["reconcile_attempts"]
    assert (row["status"], usage_status(db, job)) == ("failed", "refunded")
    with db.connect() as conn:
        reasons = (
            conn.execute(sa.text("SELECT reason FROM credit_anomalies WHERE job_id = :j"), {"j": str(job)})
            .scalars()
            .all()
        )
    assert "reconcile_exhausted" in reasons
