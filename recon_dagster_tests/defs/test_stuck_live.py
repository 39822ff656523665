"""``stuck_jobs`` is live and a real table (issue 55, item 6): every reconcile run that worked jobs
records it again, so a job force-failed a minute ago is gone from it at once, and each row is a
Dagster table row with its kind, attempt n of max, next attempt, last reason and links to the job's
runs and its story."""

from __future__ import annotations

import dagster as dg
import pytest

from recon_dagster.core.kinds import MAX_ATTEMPTS
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick

STUCK = dg.AssetKey("stuck_jobs")


def _latest(instance: dg.DagsterInstance) -> dict:
    event = instance.get_latest_materialization_event(STUCK)
    assert event is not None, "stuck_jobs was never recorded"
    return event.asset_materialization.metadata


@pytest.mark.slow
def test_a_reconcile_run_refreshes_stuck_jobs_and_a_force_failed_job_leaves_it(
    db, instance, media_dir, sandbox
):
    running = Scenario(outcome="run_forever")
    _, at_cap, _ = stale_job_with_task(
        db, sandbox, "replicate-prediction", running, attempts=MAX_ATTEMPTS - 1
    )
    # Stuck: its provider does not answer (a job whose poll says it still runs is not listed).
    down = Scenario(outcome="run_forever", server_error_first=1_000_000)
    _, young, _ = stale_job_with_task(db, sandbox, "replicate-prediction", down, attempts=3)
    defs = make_defs(media_dir, cadence_seconds=0, single_run_below=5)
    # Before: the health schedule's snapshot lists both.
    assert defs.resolve_job_def("reconcile_health_job").execute_in_process(instance=instance).success
    before = _latest(instance)["table"].value
    assert {r.data["job_id"] for r in before.records} == {str(at_cap), str(young)}

    tick(defs, instance)  # at_cap reaches the cap: force-failed and refunded

    table = _latest(instance)["table"].value
    rows = {r.data["job_id"]: r.data for r in table.records}
    assert set(rows) == {str(young)}, rows
    row = rows[str(young)]
    assert row["kind"] == "replicate-prediction"
    assert row["attempt"] == f"4 of {MAX_ATTEMPTS}"
    assert row["next_attempt"] and row["last_reason"]
    assert f"recon-job-{young}" in row["runs"]
    assert str(young) in row["story"]
    assert [c.name for c in table.schema.columns][:4] == ["job_id", "kind", "attempt", "attempts_left"]
