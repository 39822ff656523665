"""Shadow counts toward the cap only what enforce
counts (a poll its account never let out is no attempt in shadow either), and in a mixed rollout
an operator's action never changes a shadowed kind's rows.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

import pytest
import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.providers.limit_config import account_limits_from_env
from recon_dagster.providers.limits import AccountLimiter, account_limiter
from recon_dagster.reconcile.plan import build_plan
from recon_dagster.reconcile.reconciler import ReconcileSettings
from recon_dagster.reconcile.shadow import SHADOW, Modes, ShadowReconciler
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve

pytestmark = pytest.mark.timeout(120)


def _decisions(db: sa.Engine, job) -> list[tuple[str, str]]:
    with db.connect() as conn:
        return [
            (r.action, r.reason)
            for r in conn.execute(
                sa.text("SELECT action, reason FROM reconcile_decisions WHERE job_id = :j ORDER BY id"),
                {"j": str(job)},
            )
        ]


def test_shadow_does_not_count_polls_its_account_never_let_out_toward_the_cap(
    db, sandbox, media_dir, monkeypatch
) -> None:
    """A shadowed job one counted attempt from the cap's last: three cadences its account is
    blocked (three ``defer`` decisions), then it is let out: shadow decides the next counted
    attempt (2 of 3), then the force-fail (3), as enforce would, never a force-fail after defers."""
    monkeypatch.setenv("RECON_LIMITS", "database")
    monkeypatch.setenv("RECON_LIMIT_KIE", f"account=shadow-{secrets.token_hex(4)}")
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "1")
    limiter = account_limiter(account_limits_from_env("kie"))
    assert limiter is not None
    limiter.ensure()
    user = make_user(db, sub=50)
    task = sandbox.add_task("kie-standard", Scenario(outcome="run_forever"))
    job = make_job(
        db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=600,
        reconcile_attempts=1,
    )  # fmt: skip
    reserve(db, job, user, 5)
    settings = ReconcileSettings(max_attempts=3, cadence=timedelta(0), account_wait=timedelta(0))
    upstream = providers_from_env()
    shadow = ShadowReconciler(
        db, upstream, LocalMediaStore(base_dir=media_dir), settings=settings, modes=Modes(default=SHADOW)
    )

    def cadence() -> str:
        rows, _ = shadow.claim([jobs_db.Claim(job, 0)], "shadow-run")
        shadow.act(shadow.poll(rows), "shadow-run")
        return _decisions(db, job)[-1][0]

    AccountLimiter(limiter.limits, limiter._engine).block_for(3600)
    assert [cadence() for _ in range(3)] == ["defer"] * 3
    assert sandbox.poll_count(task) == 0
    plan = build_plan(db, upstream, settings, shadowed=shadow.modes.shadowed)
    [planned] = [j for j in plan.jobs if j.job_id == str(job)]
    assert planned.action.value == "defer", planned
    with db.begin() as conn:  # the block ends
        conn.execute(
            sa.text("UPDATE provider_limit_accounts SET blocked_until = 'epoch' WHERE account = :a"),
            {"a": limiter.limits.account},
        )
        conn.execute(
            sa.text("UPDATE provider_limit_buckets SET stamp = now(), tokens = burst WHERE account = :a"),
            {"a": limiter.limits.account},
        )
    plan = build_plan(db, upstream, settings, shadowed=shadow.modes.shadowed)
    [planned] = [j for j in plan.jobs if j.job_id == str(job)]
    assert planned.action.value == "leave_alone" and "attempt 2 of 3" in planned.reason, planned
    assert cadence() == "leave_alone" and "attempt 2 of 3" in _decisions(db, job)[-1][1]
    assert cadence() == "force_fail"
    assert job_row(db, job)["reconcile_attempts"] == 1  # shadow wrote nothing


@pytest.mark.parametrize("action", ["retry", "fail"])
def test_in_a_mixed_rollout_an_operator_action_on_a_shadowed_kind_changes_nothing(
    db, sandbox, monkeypatch, action: str
) -> None:
    """Enforce by default, one kind shadowed (rollout.md's mixed setup): the operator's retry or
    fail of that kind's job is refused with nothing written (job, credits, events); the same
    action on an enforced kind's job goes through."""
    from recon_dagster.operator.actions import OperatorError, fail_now, retry_now
    from recon_dagster_tests.support.world import fingerprint

    monkeypatch.setenv("RECON_SHADOW_KINDS", "kie-veo")
    user = make_user(db, sub=50)
    jobs = {}
    for kind in ("kie-veo", "kie-standard"):
        task = sandbox.add_task(kind, Scenario(outcome="run_forever"))
        jobs[kind] = make_job(db, user, provider_kind=kind, provider_task_id=task, started_minutes_ago=600)
        reserve(db, jobs[kind], user, 5)

    def act(job) -> object:
        if action == "retry":
            return retry_now(db, job, who="probe", why="probe")
        return fail_now(db, job, who="probe", reason="probe")

    before = fingerprint(db, None)
    with pytest.raises(OperatorError, match="shadow"):
        act(jobs["kie-veo"])
    assert fingerprint(db, None) == before
    act(jobs["kie-standard"])
    assert fingerprint(db, None) != before


# -- successes finalize refuses before any download, on every provider ------------------------


class _Answers:
    """An upstream whose poll answers ``status`` (a success), with the task id it names."""

    def __init__(self, status) -> None:
        self.status = status

    def poll(self, kind: str, task_id: str):
        return self.status.model_copy(
            update={"provider_kind": kind, "task_id": self.status.task_id or task_id}
        )

    def media_headers(self, kind, ref):
        return {}


def _success(**kw):
    from recon_dagster.providers.status import UpstreamState, UpstreamStatus

    return UpstreamStatus(provider_kind="-", state=UpstreamState.SUCCEEDED, **kw)


def _media(kind: str):
    from recon_dagster.providers.status import MediaRef

    return (MediaRef(url="https://media.example/x", kind=kind),)


# (kind, job type, the success upstream answers)
REFUSED = {
    "dubbing_empty": ("elevenlabs-async", "audio-dubbing", lambda: _success()),
    "suno_lyrics_only": ("kie-suno", "suno-music", lambda: _success(result={"text": "la la"})),
    "replicate_text_for_image": (
        "replicate-prediction",
        "image",
        lambda: _success(result={"output": "a cat"}),
    ),
    "training_no_weights": ("replicate-training", "lora-training", lambda: _success(result={"version": "v"})),
    "text_kind_empty": ("kie-standard", "text-generation", lambda: _success()),
    "replicate_foreign": (
        "replicate-prediction",
        "image",
        lambda: _success(task_id="not-the-rows", media=_media("image")),
    ),
    "elevenlabs_foreign": (
        "elevenlabs-async",
        "audio",
        lambda: _success(task_id="not-the-rows", media=_media("audio")),
    ),
}


@pytest.mark.parametrize("attempts", [0, 17], ids=["first", "at_cap"])
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_plan_shadow_and_enforce_agree_on_a_success_finalize_refuses(
    db, media_dir, case: str, attempts: int
) -> None:
    from recon_dagster.reconcile.reconciler import Reconciler

    kind, job_type, status = REFUSED[case]
    user = make_user(db, sub=100)
    job = make_job(
        db, user, provider_kind=kind, provider_task_id=f"task-{secrets.token_hex(4)}", job_type=job_type,
        started_minutes_ago=6000, reconcile_attempts=attempts,
    )  # fmt: skip
    reserve(db, job, user, 9)
    upstream = _Answers(status())
    settings = ReconcileSettings()
    expected = "force_fail" if attempts == settings.max_attempts - 1 else "count"

    [planned] = [j for j in build_plan(db, upstream, settings).jobs if j.job_id == str(job)]
    assert planned.action.value == expected, planned

    store = LocalMediaStore(base_dir=media_dir)
    shadow = ShadowReconciler(db, upstream, store, settings=settings, modes=Modes(default=SHADOW))
    rows, _ = shadow.claim([jobs_db.Claim(job, attempts + 1)], "shadow-run")
    shadow.act(shadow.poll(rows), "shadow-run")
    assert [a for a, _ in _decisions(db, job)] == [expected]

    with db.begin() as conn:
        assert jobs_db.claim_jobs(conn, [jobs_db.Claim(job, attempts)], "run-1", settings.lease_ttl)
    Reconciler(db, upstream, store, settings=settings).reconcile(job, "run-1")
    row = job_row(db, job)
    if expected == "count":
        assert row["status"] == "processing" and row["reconcile_attempts"] == attempts + 1, row
    else:
        assert row["status"] == "failed", row


@pytest.mark.parametrize("attempts", [15, 16, 17], ids=["two_before", "one_before", "at_last"])
def test_a_takeover_of_a_dead_runs_lease_is_counted_alike_by_plan_shadow_and_enforce(
    db, sandbox, media_dir, attempts: int
) -> None:
    """A run died holding the job's lease (expired now): taking it over counts that run's attempt.
    Plan and shadow count it too, so the three agree where the cap falls (18): below it the poll
    of a still-running task counts one more; at it the takeover itself force-fails."""
    from recon_dagster.reconcile.reconciler import Reconciler

    user = make_user(db, sub=100)
    task = sandbox.add_task("kie-standard", Scenario(outcome="run_forever"))
    job = make_job(
        db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=600,
        reconcile_attempts=attempts,
    )  # fmt: skip
    reserve(db, job, user, 9)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_lease_owner = 'dead-run', "
                "reconcile_lease_expires_at = now() - interval '1 minute' WHERE id = :j"
            ),
            {"j": str(job)},
        )
    upstream = providers_from_env()
    settings = ReconcileSettings()
    store = LocalMediaStore(base_dir=media_dir)
    after = attempts + 2  # the takeover, then this run's poll
    expected = "leave_alone" if after < settings.max_attempts else "force_fail"

    [planned] = [j for j in build_plan(db, upstream, settings).jobs if j.job_id == str(job)]
    assert planned.action.value == expected, planned

    shadow = ShadowReconciler(db, upstream, store, settings=settings, modes=Modes(default=SHADOW))
    rows, settled = shadow.claim([jobs_db.Claim(job, attempts + 2)], "shadow-run")
    shadow.act(shadow.poll(rows), "shadow-run")
    assert [a for a, _ in _decisions(db, job)] == [expected]

    enforce = Reconciler(db, upstream, store, settings=settings)
    work, done = enforce.claim([jobs_db.Claim(job, attempts + 2)], "run-1")
    if work:
        enforce.act(enforce.poll(work), "run-1")
    row = job_row(db, job)
    if expected == "leave_alone":
        assert row["status"] == "processing" and row["reconcile_attempts"] == after, row
    else:
        assert row["status"] == "failed", row
