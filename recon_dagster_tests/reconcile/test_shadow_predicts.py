"""Plan and shadow predict what enforce does.

- Shadow writes no attempt counter, so it counts the cadences it decided a job itself (its own
  ``reconcile_decisions``) and predicts the force-fail at the cap exactly when enforce, on a twin
  job, force-fails; the agreement report grades a job completed afterwards as harmful.
- A success that finalize refuses before any download (a text result for an image job, another
  task's result) is predicted as a counted attempt, or a force-fail at the cap, never "complete".

Real sensor and runs (or the reconciler itself), the sandbox over HTTP, real PostgreSQL.
"""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from recon_dagster.cli.commands import main
from recon_dagster.db import jobs as jobs_db
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.plan import build_plan
from recon_dagster.reconcile.reconciler import Reconciler, ReconcileSettings
from recon_dagster.reconcile.shadow import SHADOW, Modes, ShadowReconciler
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import make_defs, tick, usage_status

pytestmark = pytest.mark.timeout(180)


def _decisions(db: sa.Engine, job: uuid.UUID) -> list[sa.Row]:
    with db.connect() as conn:
        return conn.execute(
            sa.text("SELECT action, attempt, reason, refund_subscription + refund_topup AS refund "
                    "FROM reconcile_decisions WHERE job_id = :j ORDER BY id"),
            {"j": str(job)},
        ).all()  # fmt: skip


# -- shadow reaches the cap ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("shadowed", "enforced"), [("kie-kling3", "kie-veo"), ("replicate-prediction", "kie-standard")]
)
def test_shadow_predicts_the_force_fail_at_the_cap_when_its_enforced_twin_is_force_failed(
    db, sandbox, media_dir, instance, monkeypatch, shadowed: str, enforced: str
) -> None:
    """Two jobs whose upstream tasks never finish, one of a shadowed kind, its twin enforced; the
    cap is 3 and the cadence 0, so every tick is a cadence. Tick by tick, shadow decides what
    enforce does to the twin: leave it (attempt 1, 2), then force-fail and refund it (3)."""
    monkeypatch.setenv("RECON_SHADOW_KINDS", shadowed)
    user = make_user(db, sub=100, topup=100)
    jobs = {}
    for kind in (shadowed, enforced):
        task = sandbox.add_task(kind, Scenario(outcome="run_forever"))
        jobs[kind] = make_job(db, user, provider_kind=kind, provider_task_id=task, started_minutes_ago=600)
        reserve(db, jobs[kind], user, 7, 5, 2)
    defs = make_defs(media_dir, max_attempts=3, cadence_seconds=0)

    for n in (1, 2, 3):
        tick(defs, instance)
        decided = _decisions(db, jobs[shadowed])
        assert len(decided) == n, decided
        twin = job_row(db, jobs[enforced])
        if n < 3:
            assert decided[-1].action == "leave_alone" and f"attempt {n} of 3" in decided[-1].reason
            assert twin["status"] == "processing" and twin["reconcile_attempts"] == n
        else:  # today: "leave_alone ... attempt 1 of 3", forever
            assert decided[-1].action == "force_fail" and decided[-1].attempt == 3, decided[-1]
            assert decided[-1].refund == 7  # what the twin's force-fail refunded
            assert twin["status"] == "failed" and usage_status(db, jobs[enforced]) == "refunded"
    shadow_row = job_row(db, jobs[shadowed])
    assert shadow_row["reconcile_attempts"] == 0 and shadow_row["status"] == "processing"  # never written

    # The app's worker then completes the shadowed job: enforce would have refunded it.
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET status = 'completed' WHERE id = :j"), {"j": str(jobs[shadowed])}
        )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--shadow-report", "--json"]) == 1
    assert json.loads(out.getvalue())["harmful"] == [str(jobs[shadowed])]  # today: "agree"


def test_plan_counts_a_shadowed_jobs_attempts_from_its_decisions(
    db, sandbox, media_dir, instance, monkeypatch
) -> None:
    monkeypatch.setenv("RECON_MODE", "shadow")
    user = make_user(db)
    task = sandbox.add_task("kie-veo", Scenario(outcome="run_forever"))
    job = make_job(db, user, provider_kind="kie-veo", provider_task_id=task, started_minutes_ago=600)
    defs = make_defs(media_dir, max_attempts=3, cadence_seconds=0)
    tick(defs, instance)
    tick(defs, instance)
    out = io.StringIO()
    monkeypatch.setenv("RECON_MAX_ATTEMPTS", "3")
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--json"]) == 0
    [planned] = [j for j in json.loads(out.getvalue())["jobs"] if j["job_id"] == str(job)]
    assert planned["action"] == "force_fail" and planned["attempt"] == 3, planned


# -- a success finalize refuses -------------------------------------------------------------


class Misrouted:
    """The provider answers the poll of the row's task with another task's (finished) result."""

    def __init__(self, other: str) -> None:
        self._providers = providers_from_env()
        self._other = other

    def poll(self, kind: str, task_id: str):
        return self._providers.poll(kind, self._other)

    def media_headers(self, kind, ref):
        return self._providers.media_headers(kind, ref)


def _refused_success(db, sandbox, case: str, attempts: int):
    """A stale job whose upstream says succeeded with a result finalize refuses; (job, upstream)."""
    user = make_user(db, sub=100, topup=100)
    if case == "text_for_image":
        kind, job_type = "kie-standard", "image"
        task = sandbox.add_task(kind, Scenario(polls_before_done=0, media_kind="text"))
        upstream = providers_from_env()
    elif case == "text_for_video":
        kind, job_type = "kie-standard", "video"
        task = sandbox.add_task(kind, Scenario(polls_before_done=0, media_kind="text"))
        upstream = providers_from_env()
    else:  # another task's result
        kind, job_type = "kie-veo", "video"
        task = sandbox.add_task(kind, Scenario(polls_before_done=0))
        upstream = Misrouted(sandbox.add_task(kind, Scenario(polls_before_done=0)))
    job = make_job(
        db, user, provider_kind=kind, provider_task_id=task, job_type=job_type, started_minutes_ago=600,
        reconcile_attempts=attempts,
    )  # fmt: skip
    reserve(db, job, user, 9, 9, 0)
    return job, upstream


@pytest.mark.parametrize("attempts", [0, 17], ids=["first", "at_cap"])
@pytest.mark.parametrize("case", ["text_for_image", "text_for_video", "foreign_task"])
def test_plan_and_shadow_predict_what_enforce_does_with_a_success_finalize_refuses(
    db, sandbox, media_dir, case: str, attempts: int
) -> None:
    job, upstream = _refused_success(db, sandbox, case, attempts)
    settings = ReconcileSettings()
    expected = "force_fail" if attempts == 17 else "count"

    plan = build_plan(db, upstream, settings)
    [planned] = [j for j in plan.jobs if j.job_id == str(job)]
    assert planned.action.value == expected, planned  # today: "complete"
    assert "finalize refuses it" in planned.reason

    store = LocalMediaStore(base_dir=media_dir)
    shadow = ShadowReconciler(db, upstream, store, settings=settings, modes=Modes(default=SHADOW))
    rows, _ = shadow.claim([jobs_db.Claim(job, attempts + 1)], "shadow-run")
    shadow.act(shadow.poll(rows), "shadow-run")
    [decision] = _decisions(db, job)
    assert decision.action == expected and "finalize refuses it" in decision.reason
    assert job_row(db, job)["reconcile_attempts"] == attempts  # shadow wrote nothing

    enforce = Reconciler(db, upstream, store, settings=settings)
    with db.begin() as conn:
        assert jobs_db.claim_jobs(conn, [jobs_db.Claim(job, attempts)], "run-1", settings.lease_ttl)
    outcome = enforce.reconcile(job, "run-1")
    row = job_row(db, job)
    if expected == "count":
        assert outcome.outcome is Outcome.ERROR and row["reconcile_attempts"] == 1
        assert row["status"] == "processing" and usage_status(db, job) == "reserved"
    else:
        assert outcome.outcome is Outcome.EXHAUSTED and row["status"] == "failed"
        assert usage_status(db, job) == "refunded"
    assert datetime.now(UTC)  # the three paths ran on the same world
