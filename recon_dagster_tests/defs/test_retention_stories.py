"""The job_story pages' retention on a real instance and PostgreSQL: the recon_job partitions of
jobs ended past the horizon go, a few at a time; a job in flight, with credits reserved or
reconciled since keeps its page, and so does a key that is no job id."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import dagster as dg
import sqlalchemy as sa

from recon_dagster.defs.explain.stories import PARTITIONS
from recon_dagster.defs.retention.stories import prune_stories
from recon_dagster.operator.explain import load_story, to_text
from recon_dagster_tests.support.factories import make_job, make_user, reserve, sql
from recon_dagster_tests.support.reconcile import make_defs


def _ended(db: sa.Engine, user: uuid.UUID, status: str, days_ago: float) -> uuid.UUID:
    job = make_job(db, user, status=status, provider_kind="kie-standard")
    sql(
        db,
        "UPDATE jobs SET completed_at = now() - make_interval(secs => :s), "
        "updated_at = now() - make_interval(secs => :s) WHERE id = :j",
        j=str(job), s=days_ago * 86_400,
    )  # fmt: skip
    return job


def _event(db: sa.Engine, job: uuid.UUID, days_ago: float) -> None:
    sql(
        db,
        "INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome, created_at) "
        "VALUES (:j, 'kie-standard', 1, 'failed', now() - make_interval(secs => :s))",
        j=str(job), s=days_ago * 86_400,
    )  # fmt: skip


def test_pages_of_jobs_ended_past_the_horizon_go_and_no_job_in_flight_loses_its_own(
    db: sa.Engine, instance: dg.DagsterInstance
) -> None:
    user = make_user(db)
    old_done = _ended(db, user, "completed", 40)
    old_failed = _ended(db, user, "failed", 35)
    recent = _ended(db, user, "completed", 5)
    in_flight = make_job(
        db, user, status="processing", provider_kind="kie-standard", started_minutes_ago=60 * 24 * 60
    )
    unrefunded = _ended(db, user, "failed", 40)
    reserve(db, unrefunded, user, 5)  # credits still reserved: its money is not settled
    touched = _ended(db, user, "failed", 40)
    _event(db, touched, 1)  # an operator action reconciled it again yesterday
    deleted_old = uuid.uuid4()  # the app deleted these jobs; their last attempts 50 and 2 days ago
    deleted_young = uuid.uuid4()
    _event(db, deleted_old, 50)
    _event(db, deleted_young, 2)
    keys = [
        str(j)
        for j in (old_done, old_failed, recent, in_flight, unrefunded, touched, deleted_old, deleted_young)
    ]
    instance.add_dynamic_partitions(PARTITIONS, [*keys, "not-a-job-id"])

    cut = datetime.now(UTC) - timedelta(days=30)
    report = prune_stories(instance, db, cut, budget_s=60, page=3)
    assert report.deleted == 3 and report.batches == 3 and report.finished
    left = set(instance.get_dynamic_partitions(PARTITIONS))
    assert left == {str(j) for j in (recent, in_flight, unrefunded, touched, deleted_young)} | {
        "not-a-job-id"
    }
    # explain reads our tables, not the page: a job whose page went still has its story.
    assert "failed" in to_text(load_story(db, old_failed), None)
    # A second pass finds nothing more to delete.
    assert prune_stories(instance, db, cut, budget_s=60).deleted == 0


def test_a_pass_stops_at_its_time_budget(db: sa.Engine, instance: dg.DagsterInstance) -> None:
    user = make_user(db)
    jobs = [str(_ended(db, user, "completed", 40)) for _ in range(4)]
    instance.add_dynamic_partitions(PARTITIONS, jobs)
    ticks = iter(range(100))
    report = prune_stories(
        instance,
        db,
        datetime.now(UTC) - timedelta(days=30),
        budget_s=1.5,
        page=2,
        clock=lambda: float(next(ticks)),
    )
    assert not report.finished and report.deleted == 2
    assert len(instance.get_dynamic_partitions(PARTITIONS)) == 2


def test_prune_history_deletes_old_story_pages(
    db: sa.Engine, instance: dg.DagsterInstance, media_dir: str
) -> None:
    """The whole job in-process, with the shipped 30-day horizon."""
    user = make_user(db)
    old, young = _ended(db, user, "completed", 31), _ended(db, user, "completed", 29)
    instance.add_dynamic_partitions(PARTITIONS, [str(old), str(young)])
    result = make_defs(media_dir).resolve_job_def("prune_history").execute_in_process(instance=instance)
    assert result.success
    assert instance.get_dynamic_partitions(PARTITIONS) == [str(young)]
