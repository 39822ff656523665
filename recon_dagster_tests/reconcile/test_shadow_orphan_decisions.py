"""A shadow decision of the orphan sweep about a job's task does not hide the job from the shadow
sensor (issue 49): the sensor's "decided within the cadence" counted the sweep's ``orphan_*`` rows
too, so a shadowed job whose task the sweep had judged was neither scanned nor decided for a
cadence."""

from __future__ import annotations

import uuid
from datetime import timedelta

import sqlalchemy as sa

from recon_dagster.reconcile.plan import PlanAction, PlannedJob
from recon_dagster.reconcile.shadow import SHADOW, Modes, record_decision, scan_due
from recon_dagster_tests.support.factories import make_job

KIND = "replicate-prediction"
CADENCE = timedelta(minutes=5)
ALL_SHADOW = Modes(SHADOW, frozenset(), frozenset())


def _orphan_decision(db: sa.Engine, job: uuid.UUID) -> None:
    """What the orphan sweep records for a shadowed kind (``orphan_sweep.record_shadow``)."""
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO reconcile_decisions (job_id, provider_kind, attempt, upstream, action, reason, mode) "
                "VALUES (:j, :k, 0, 'running t-1', 'orphan_adopt', 'its job has no task id yet', 'shadow')"
            ),
            {"j": str(job), "k": KIND},
        )


def test_an_orphan_decision_leaves_the_job_to_the_shadow_sensor(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, provider_kind=KIND, provider_task_id="t-1", started_minutes_ago=600)
    _orphan_decision(db, job)
    with db.connect() as conn:
        assert job in {r.id for r in scan_due(conn, 10, CADENCE, modes=ALL_SHADOW)}

    decided = PlannedJob(str(job), KIND, 600.0, 1, "running", PlanAction.COUNT, "still running")
    assert record_decision(db, decided, None, CADENCE)
    # ...and that decision hides it for the cadence, as before.
    with db.connect() as conn:
        assert job not in {r.id for r in scan_due(conn, 10, CADENCE, modes=ALL_SHADOW)}
    assert not record_decision(db, decided, None, CADENCE)
