"""Bugs the fault harness and the state machine found on the code as it stands, pinned with
``xfail(strict=True)``: the day a fix lands, the pin fails (XPASS) and must be turned into a plain
test. Each names its invariant and how it was found."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.reconcile.reconciler import ReconcileSettings
from recon_dagster_tests.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.reconcile_support import usage_status

SETTINGS = ReconcileSettings(max_attempts=4)


def _run_dies_after_claiming(db: sa.Engine, owner: str) -> int:
    """One sensor tick's claim of every due job, then the run dies; time passes past the lease."""
    with db.begin() as conn:
        rows = jobs_db.scan_stale(conn, 100)
        won = jobs_db.claim_jobs(
            conn, [jobs_db.Claim(r.id, r.reconcile_attempts) for r in rows], owner, SETTINGS.lease_ttl
        )
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_lease_expires_at = reconcile_lease_expires_at - interval '16 minutes'"
            )
        )
    return len(won)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "bug: a lease takeover counts an attempt (claim_jobs) but only Reconciler._attempt_failed "
        "checks the cap; a job whose runs keep dying on it climbs past RECON_MAX_ATTEMPTS for ever, "
        "credits reserved, no reconcile_exhausted anomaly (state machine, full profile, seed 20261130)"
    ),
)
def test_attempts_stay_capped_while_runs_keep_dying_on_a_job(db: sa.Engine) -> None:
    user = make_user(db)
    job = make_job(
        db, user, provider_kind="kie-standard", provider_task_id="never-polled", started_minutes_ago=60
    )
    reserve(db, job, user, 10)
    for i in range(2 * SETTINGS.max_attempts):
        assert _run_dies_after_claiming(db, f"dying-run-{i}") <= 1
    row = job_row(db, job)
    # The cap holds: either still under it, or ended at it (failed, refunded) by whoever saw it.
    assert row["reconcile_attempts"] <= SETTINGS.max_attempts or (
        row["status"] == "failed" and usage_status(db, job) == "refunded"
    ), f"{row['reconcile_attempts']} attempts, {row['status']}, credits {usage_status(db, job)}"
