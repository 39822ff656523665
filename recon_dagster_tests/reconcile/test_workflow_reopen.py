"""A failed workflow is reopened only once every job of its failed node in that execution has
completed, and by the last of them to complete. Real PostgreSQL, real HTTP to
the sandbox; the race runs two finalizes on two connections at once."""

from __future__ import annotations

import contextlib
import threading
import uuid

import pytest
import sqlalchemy as sa

from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile import finalize as finalize_mod
from recon_dagster.reconcile.finalize import (
    MediaPolicy,
    ProviderResult,
    fail_and_refund,
    finalize_job_with_media,
)
from recon_dagster_tests.support.factories import job_row, make_job, make_user, make_workflow
from recon_dagster_tests.support.reconcile import count, finished_kie_job, make_defs, one, tick


def _node_jobs(db, sandbox, n: int, node: str = "X"):
    """A workflow failed on ``node`` and ``n`` in-flight jobs of that node whose tasks finished."""
    user = make_user(db)
    wf = make_workflow(db, user, failed_nodes=[node])
    jobs = []
    for _ in range(n):
        job, task = finished_kie_job(db, sandbox, user, workflow_execution_id=wf, node_id=node)
        result = ProviderResult.from_status(providers_from_env().poll("kie-standard", task))
        jobs.append((job, result))
    return wf, jobs


def _finalize(db, media_dir, job, result):
    policy = MediaPolicy(headers_for=providers_from_env().media_headers)
    return finalize_job_with_media(
        db, LocalMediaStore(base_dir=media_dir), job, result, source="reconcile", policy=policy
    )


def _wf_status(db: sa.Engine, wf: uuid.UUID) -> str:
    return one(db, "SELECT status FROM workflow_executions WHERE id = :w", w=wf)


def test_workflow_is_not_reopened_while_a_sibling_of_the_node_is_still_processing(db, sandbox, media_dir):
    wf, [(a, ra), (b, _)] = _node_jobs(db, sandbox, 2)

    out = _finalize(db, media_dir, a, ra)

    assert out.ok and out.workflow_reopened is False
    assert _wf_status(db, wf) == "failed"
    # B then fails for real: the workflow was never flipped, so it is (still) failed.
    assert fail_and_refund(db, b, "upstream failed")
    assert _wf_status(db, wf) == "failed"


@pytest.mark.parametrize("other", ["pending", "failed", "cancelled"])
def test_workflow_is_not_reopened_while_any_sibling_has_not_completed(db, sandbox, media_dir, other):
    wf, [(a, ra), (b, _), (c, rc)] = _node_jobs(db, sandbox, 3)
    assert _finalize(db, media_dir, c, rc).ok  # one sibling completed, one not
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET status = :s WHERE id = :j"), {"s": other, "j": str(b)})

    assert _finalize(db, media_dir, a, ra).workflow_reopened is False
    assert _wf_status(db, wf) == "failed"


def test_the_last_sibling_to_complete_reopens_the_workflow(db, sandbox, media_dir):
    wf, [(a, ra), (b, rb)] = _node_jobs(db, sandbox, 2)

    first = _finalize(db, media_dir, a, ra)
    second = _finalize(db, media_dir, b, rb)

    assert (first.workflow_reopened, second.workflow_reopened) == (False, True)
    assert _wf_status(db, wf) == "completed"
    assert one(db, "SELECT failed_nodes::text FROM workflow_executions WHERE id = :w", w=wf) == "[]"


def test_jobs_of_other_nodes_or_executions_do_not_hold_the_reopen_back(db, sandbox, media_dir):
    wf, [(a, ra)] = _node_jobs(db, sandbox, 1)
    user = one(db, "SELECT user_id FROM workflow_executions WHERE id = :w", w=wf)
    make_job(
        db, user, provider_kind="kie-standard", provider_task_id="t-y", workflow_execution_id=wf, node_id="Y"
    )
    other_wf, _ = _node_jobs(db, sandbox, 1)  # node X of another execution, still processing

    assert _finalize(db, media_dir, a, ra).workflow_reopened is True
    assert _wf_status(db, wf) == "completed"
    assert _wf_status(db, other_wf) == "failed"


@pytest.mark.parametrize("round_", range(3))
def test_two_siblings_completing_at_once_reopen_the_workflow_exactly_once(
    db, sandbox, media_dir, monkeypatch, round_
):
    """Both completions are written (uncommitted) before either checks its siblings: each sees the
    other still processing in its own snapshot. The later one must still reopen."""
    wf, [(a, ra), (b, rb)] = _node_jobs(db, sandbox, 2)
    both_completed = threading.Barrier(2)
    settle = finalize_mod.settle_completion

    def settle_then_wait(conn, row, **kwargs):
        settled = settle(conn, row, **kwargs)
        with contextlib.suppress(threading.BrokenBarrierError):  # asserted below
            both_completed.wait(timeout=10)  # both rows completed, neither transaction committed
        return settled

    monkeypatch.setattr(finalize_mod, "settle_completion", settle_then_wait)
    results: dict[uuid.UUID, finalize_mod.FinalizeResult] = {}

    def run(job: uuid.UUID, result: ProviderResult) -> None:
        results[job] = _finalize(db, media_dir, job, result)

    threads = [threading.Thread(target=run, args=jr) for jr in ((a, ra), (b, rb))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert not both_completed.broken
    assert all(r.ok for r in results.values())
    assert sorted(r.workflow_reopened for r in results.values()) == [False, True]
    assert _wf_status(db, wf) == "completed"


# --- through a reconcile run (sensor tick, in-process run) ------------------------------------------


def _stuck_in_workflow(db, sandbox, failed_nodes, status="failed"):
    user = make_user(db)
    wf = make_workflow(db, user, status=status, failed_nodes=failed_nodes)
    job, _ = finished_kie_job(db, sandbox, user, workflow_execution_id=wf, node_id="X")
    return wf, job


def test_sole_cause_workflow_failure_is_reopened(db, instance, media_dir, sandbox):
    wf, job = _stuck_in_workflow(db, sandbox, ["X"])

    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "completed"
    assert one(db, "SELECT status FROM workflow_executions WHERE id = :w", w=wf) == "completed"
    assert one(db, "SELECT failed_nodes::text FROM workflow_executions WHERE id = :w", w=wf) == "[]"


def test_cancelled_workflow_is_not_flipped_back(db, instance, media_dir, sandbox):
    wf, job = _stuck_in_workflow(db, sandbox, ["X"], status="cancelled")

    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "completed"
    assert one(db, "SELECT status FROM workflow_executions WHERE id = :w", w=wf) == "cancelled"


def test_multi_failure_workflow_stays_failed_but_the_output_lands(db, instance, media_dir, sandbox):
    wf, job = _stuck_in_workflow(db, sandbox, ["X", "Y"])

    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "completed"
    assert count(db, "assets", job) == 1
    assert one(db, "SELECT status FROM workflow_executions WHERE id = :w", w=wf) == "failed"
