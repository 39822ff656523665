"""What a running task is doing upstream is said, not "still running" (issue 55, item 4): a fal
request in queue says its position, a Replicate prediction starting says it waits for a machine;
the attempt's detail (the story, stuck_jobs, the force-fail's reason) carries it."""

from __future__ import annotations

import pytest

from recon_dagster.providers import parse_poll_response
from recon_dagster.reconcile.decide import decide_on_status


@pytest.mark.parametrize(
    ("kind", "body", "said"),
    [
        (
            "fal-image",
            {"status": "IN_QUEUE", "queue_position": 3},
            "upstream still running: in queue at fal, position 3",
        ),
        ("fal-video", {"status": "IN_QUEUE"}, "upstream still running: in queue at fal"),
        ("fal-image", {"status": "IN_PROGRESS"}, "upstream still running: in progress at fal"),
        (
            "replicate-prediction",
            {"id": "p1", "status": "starting"},
            "upstream still running: starting at replicate (waiting for a machine)",
        ),
        (
            "replicate-prediction",
            {"id": "p1", "status": "processing"},
            "upstream still running: processing at replicate",
        ),
    ],
)
def test_a_running_task_says_what_it_is_doing_upstream(kind, body, said):
    status = parse_poll_response(kind, body)
    assert decide_on_status(status).reason == said


@pytest.mark.parametrize(("kind", "job_type"), [("fal-image", "image"), ("replicate-prediction", "image")])
def test_a_force_fail_at_the_cap_says_where_the_task_was_upstream(db, sandbox, media_dir, kind, job_type):
    """The job's last attempt and the story it tells name the upstream state it was given up in."""
    import uuid

    from recon_dagster.core.kinds import MAX_ATTEMPTS
    from recon_dagster.media.store import LocalMediaStore
    from recon_dagster.operator.explain import explain, to_text
    from recon_dagster.providers import providers_from_env
    from recon_dagster.reconcile.decide import Outcome
    from recon_dagster.reconcile.reconciler import Reconciler, ReconcileSettings
    from recon_dagster.sandbox import Scenario
    from recon_dagster_tests.support.answers import lease, stale_job

    task = sandbox.add_task(kind, Scenario(outcome="run_forever"))
    _, job = stale_job(db, kind, job_type, attempts=MAX_ATTEMPTS - 1, task_id=task)
    owner = f"run-{uuid.uuid4().hex[:8]}"
    lease(db, [job], owner)
    rec = Reconciler(
        db, providers_from_env(), LocalMediaStore(base_dir=media_dir), settings=ReconcileSettings()
    )
    out = rec.reconcile(job, owner)

    provider = kind.split("-")[0]
    assert out.outcome is Outcome.EXHAUSTED
    assert (
        f"{MAX_ATTEMPTS} attempts: upstream still running: " in out.detail and f"at {provider}" in out.detail
    )
    story = to_text(explain(db, None, job), None)
    assert f"at {provider}" in story, story
