"""A job's story without launching a run (issue 55, item 7): every run that works a job, and every
operator action, records the job's ``job_story`` partition; ``stuck_jobs`` links each row to it.
Real PostgreSQL, the sandbox over HTTP, a real Dagster instance."""

from __future__ import annotations

import dagster as dg
import pytest

from recon_dagster.defs.explain.stories import JOB_STORY, PARTITIONS, story_url
from recon_dagster.defs.observe.stuck import fail_and_refund_job
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick

pytestmark = pytest.mark.postgres


def _story(instance: dg.DagsterInstance, job) -> dict:
    event = instance.get_latest_materialization_event(JOB_STORY)
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=JOB_STORY, asset_partitions=[str(job)]), limit=1
    ).records
    assert event is not None and records, f"no story recorded for {job}"
    return {k: v.value for k, v in records[0].asset_materialization.metadata.items()}


@pytest.mark.slow
def test_a_run_records_the_story_of_each_job_it_worked_and_an_operator_action_adds_to_it(
    db, instance, media_dir, sandbox
):
    _, down, _ = stale_job_with_task(
        db, sandbox, "replicate-prediction", Scenario(server_error_first=1_000_000), attempts=3
    )
    _, done, _ = stale_job_with_task(db, sandbox, "kie-standard", Scenario(polls_before_done=0))
    defs = make_defs(media_dir, single_run_below=5)

    tick(defs, instance)

    # The job it could not get on with has a page; the one it completed has none (its result says all).
    pages = set(instance.get_dynamic_partitions(PARTITIONS))
    assert str(down) in pages and str(done) not in pages
    story = _story(instance, down)
    assert "HTTP 503" in story["upstream said last"] and story["reconcile attempts"] == 4
    assert "| #4 |" in story["story"] and story["operator actions"] == 0
    # stuck_jobs links the stuck row to that page.
    table = instance.get_latest_materialization_event(dg.AssetKey("stuck_jobs")).asset_materialization
    [row] = [r.data for r in table.metadata["table"].value.records if r.data["job_id"] == str(down)]
    assert row["story"] == story_url(str(down), None)
    assert row["story"].endswith(f"/assets/job_story?view=partitions&partition={down}")

    cfg = {
        "ops": {"fail_and_refund_now_op": {"config": {"job_id": str(down), "operator": "ann", "reason": "x"}}}
    }
    assert (
        defs.resolve_job_def(fail_and_refund_job.name)
        .execute_in_process(run_config=cfg, instance=instance)
        .success
    )

    after = _story(instance, down)
    assert after["outcome"].startswith("failed") and after["operator actions"] == 1
    assert "| op 1 | operator_fail |" in after["story"]


def test_a_story_that_cannot_be_read_never_fails_the_run(db, instance, media_dir):
    from recon_dagster.defs.explain.stories import record_stories

    @dg.op
    def probe(context) -> int:  # unannotated: Dagster reads a string annotation as no type
        return record_stories(context, db, ["not-a-job-id", "00000000-0000-0000-0000-000000000000"])

    @dg.job
    def probe_job() -> None:
        probe()

    result = probe_job.execute_in_process(instance=instance)
    assert result.success and result.output_for_node("probe") == 0


@pytest.mark.parametrize(
    ("outcome", "cause", "attempt", "recorded"),
    [
        ("still_running", "answered", 3, False),  # the steady state: no story per cadence
        ("still_running", "answered", 15, False),
        ("still_running", "answered", 16, True),  # within 2 of the cap of 18
        ("still_running", "provider", 3, True),
        ("error", "provider", 3, True),
        ("error", "job", 3, True),
        ("exhausted", "answered", 18, True),
        ("recovered", "answered", 3, False),  # completed: the app's result says all
        ("failed", "answered", 3, True),
        ("swept", "not_asked", 0, True),
        ("our_fault", "internal", 3, True),
        ("skipped", "not_asked", 3, False),
        ("not_sent", "not_asked", 3, False),
        ("lost_race", None, 3, False),
    ],
)
def test_a_run_records_the_story_of_a_job_it_ended_or_could_not_get_on_with(
    outcome, cause, attempt, recorded
):
    import uuid

    from recon_dagster.defs.explain.stories import worked_jobs
    from recon_dagster.reconcile.cause import Cause
    from recon_dagster.reconcile.decide import Outcome
    from recon_dagster.reconcile.outcome import JobOutcome

    o = JobOutcome(
        uuid.uuid4(), "kie-standard", Outcome(outcome), attempt, "", 0, Cause(cause) if cause else None
    )
    assert (worked_jobs([o], cap=18) == [o.job_id]) is recorded


def test_a_run_records_at_most_its_share_of_stories_the_worst_first():
    import uuid

    from recon_dagster.defs.explain.stories import worked_jobs
    from recon_dagster.reconcile.cause import Cause
    from recon_dagster.reconcile.decide import Outcome
    from recon_dagster.reconcile.outcome import JobOutcome

    def outcome(name: str, cause: str = "provider") -> JobOutcome:
        return JobOutcome(uuid.uuid4(), "kie-standard", Outcome(name), 3, "", 0, Cause(cause))

    # An outage batch: many unanswered polls, a few force-failed and failed jobs among them.
    errors = [outcome("error") for _ in range(120)]
    worst = [outcome("exhausted", "answered"), outcome("failed", "answered"), outcome("swept", "not_asked")]
    batch = errors[:60] + worst + errors[60:] + [outcome("recovered", "answered") for _ in range(500)]

    chosen = worked_jobs(batch, cap=18, limit=10)

    assert chosen[:3] == [o.job_id for o in worst]
    assert chosen[3:] == [o.job_id for o in errors[:7]]
    assert worked_jobs(batch, cap=18, limit=0) == []
