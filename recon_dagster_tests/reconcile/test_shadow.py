"""Shadow mode: the real sensor, runs and sweep record their decisions and change nothing else; and
plan, shadow and enforce take the same decisions on the same world."""

from __future__ import annotations

import contextlib
import io
import json
from decimal import Decimal

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.cli.commands import main
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.defs.settings_check import shadow_modes
from recon_dagster.reconcile.shadow import Modes
from recon_dagster_tests.support.reconcile import make_defs, tick
from recon_dagster_tests.support.world import LIMITER_TABLES, WORLD_DECISIONS, fingerprint, seed_world

# What shadow may write: its decisions, and what every poll records anyway (the breaker's answers,
# the provider account's rate-limit tokens).
SHADOW_WRITES = LIMITER_TABLES | {"reconcile_decisions", "provider_poll_answers"}

# After enforce acts: (jobs.status, usage_logs statuses) per job named by the plan's action.
ENFORCED = {
    "complete": ("completed", ["committed"]),
    "fail": ("failed", ["refunded"]),
    "force_fail": ("failed", ["refunded"]),
    "sweep": ("failed", ["refunded"]),
}


def test_shadow_modes() -> None:
    assert shadow_modes({}) == Modes()
    m = shadow_modes({"RECON_MODE": "shadow", "RECON_ENFORCE_KINDS": "kie-veo, kie-suno"})
    assert m.shadowed("kie-standard") and m.shadowed(None) and not m.shadowed("kie-veo")
    m = shadow_modes({"RECON_SHADOW_KINDS": "kie-veo"})
    assert m.shadowed("kie-veo") and not m.shadowed("kie-standard") and not m.shadowed(None)
    for env, words in (
        ({"RECON_MODE": "dry"}, "RECON_MODE must be shadow or enforce, got 'dry'"),
        (
            {"RECON_SHADOW_KINDS": "kie-veo,kie-nope"},
            "RECON_SHADOW_KINDS names unknown provider kind(s) kie-nope",
        ),
        ({"RECON_SHADOW_KINDS": "kie-veo", "RECON_ENFORCE_KINDS": "kie-veo"}, "both name kie-veo"),
    ):
        with pytest.raises(ValueError, match=r"^RECON_") as err:
            shadow_modes(env)
        assert words in str(err.value) and "\n" not in str(err.value)


def _decisions(engine: sa.Engine) -> list[sa.Row]:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT * FROM reconcile_decisions ORDER BY id")).all()


def _plan(*args: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--json", *args]) == 0
    return json.loads(out.getvalue())


def test_plan_shadow_and_enforce_take_the_same_decisions(
    db, sandbox, media_dir, instance, monkeypatch
) -> None:
    jobs = seed_world(db, sandbox)
    names = {str(v): k for k, v in jobs.items()}
    planned = {names[j["job_id"]]: j["action"] for j in _plan()["jobs"] if j["job_id"] in names}

    monkeypatch.setenv("RECON_MODE", "shadow")
    defs = make_defs(media_dir)
    before = fingerprint(db, media_dir, skip=SHADOW_WRITES)
    tick(defs, instance, sweep=True)
    assert fingerprint(db, media_dir, skip=SHADOW_WRITES) == before  # no job, money, asset, media moved
    rows = _decisions(db)
    shadowed = {names[str(r.job_id)]: r.action for r in rows}
    # Every due job decided once, as the plan said; jobs not due (lease, cadence, threshold) not at all.
    assert len(rows) == len(shadowed)
    assert shadowed == {k: a for k, a in planned.items() if k not in ("not_stale", "leased", "cadence")}
    money = {names[str(r.job_id)]: (r.commit_credits, r.refund_subscription, r.refund_topup) for r in rows}
    for name, (_, credits) in WORLD_DECISIONS.items():
        if name in money:
            assert tuple(format(Decimal(v).normalize(), "f") for v in money[name]) == credits, name

    # The cadence: the next ticks neither request runs for them nor record them again.
    report = tick(defs, instance, sweep=True)
    assert len(_decisions(db)) == len(rows)
    assert (report.skip_reason or "").startswith("no stale job due: scanned=0 ")  # only the sweep ran

    # Enforce then applies exactly those decisions.
    monkeypatch.setenv("RECON_MODE", "enforce")
    tick(defs, instance, sweep=True)
    with db.connect() as conn:
        for name, action in shadowed.items():
            status = conn.execute(
                sa.text("SELECT status FROM jobs WHERE id = :j"), {"j": str(jobs[name])}
            ).scalar()
            logs = (
                conn.execute(
                    sa.text("SELECT status FROM usage_logs WHERE job_id = :j ORDER BY created_at, id"),
                    {"j": str(jobs[name])},
                )
                .scalars()
                .all()
            )
            if action == "leave_alone":
                assert status == "processing", name
                continue
            want_status, want_logs = ENFORCED[action]
            assert status == want_status, name
            if logs:
                assert logs[0] == want_logs[0] and all(s == "refunded" for s in logs[1:]), name


def test_shadow_per_kind_leaves_enforced_kinds_acting(db, sandbox, media_dir, instance, monkeypatch) -> None:
    jobs = seed_world(db, sandbox)
    monkeypatch.setenv("RECON_SHADOW_KINDS", "kie-standard")
    tick(make_defs(media_dir), instance, sweep=True)
    with db.connect() as conn:
        status = dict(conn.execute(sa.text("SELECT id::text, status FROM jobs")).all())
    assert {r.provider_kind for r in _decisions(db)} == {"kie-standard"}
    assert status[str(jobs["complete"])] == "processing"  # shadowed: decided, not completed
    assert status[str(jobs["complete_twice_reserved"])] == "completed"  # replicate: enforced
    assert status[str(jobs["sweep_legacy"])] == "failed"  # no kind: RECON_MODE (enforce)


def test_agreement_reports_what_became_of_each_shadowed_job(
    db, sandbox, media_dir, instance, monkeypatch
) -> None:
    from recon_dagster.defs.rollout.agreement import shadow_agreement

    jobs = seed_world(db, sandbox)
    monkeypatch.setenv("RECON_MODE", "shadow")
    defs = make_defs(media_dir)
    tick(defs, instance, sweep=True)
    # Meanwhile the app's worker finishes two jobs and a user cancels one.
    with db.begin() as conn:
        for name, status in (
            ("fail", "completed"),
            ("complete", "completed"),
            ("complete_twice_reserved", "cancelled"),
        ):
            conn.execute(
                sa.text("UPDATE jobs SET status = :s WHERE id = :j"), {"s": status, "j": str(jobs[name])}
            )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--shadow-report", "--json"]) == 1  # harmful: non-zero, for scripts
    report = json.loads(out.getvalue())
    assert report["harmful"] == [str(jobs["fail"])]
    assert report["disagree"] == [str(jobs["complete_twice_reserved"])]
    assert report["by_kind"]["kie-standard"]["agree"] == 1  # "complete", completed by the worker
    assert report["by_kind"]["kie-kling3"]["pending"] == 3  # still in flight (one waits, two at their cap)

    result = dg.materialize([shadow_agreement], resources={"database": DatabaseResource()}, instance=instance)
    [check] = result.get_asset_check_evaluations()
    assert not check.passed and check.metadata["harmful_job_ids"].value == [str(jobs["fail"])]

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        main(["plan", "--shadow-report"])
    assert f"harmful: job {jobs['fail']} [kie-kontext] shadow said fail, job is completed" in text.getvalue()


def test_a_decision_is_recorded_once_per_job_per_cadence_however_many_runs_race(db) -> None:
    import uuid
    from concurrent.futures import ThreadPoolExecutor
    from datetime import timedelta

    from recon_dagster.reconcile.plan import PlanAction, PlannedJob
    from recon_dagster.reconcile.shadow import record_decision

    job = PlannedJob(
        str(uuid.uuid4()), "kie-veo", None, 1, "running", PlanAction.LEAVE, "upstream still running"
    )
    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda _: record_decision(db, job, "run", timedelta(minutes=5)), range(16)))
    assert won.count(True) == 1 and len(_decisions(db)) == 1
    # Past the cadence (zero here) the job is decided again: one row per job per cadence.
    assert record_decision(db, job, "run", timedelta(0))
    assert len(_decisions(db)) == 2


def test_decided_jobs_do_not_hide_the_rest_of_a_backlog(
    db, sandbox, media_dir, instance, monkeypatch
) -> None:
    from recon_dagster.sandbox import Scenario
    from recon_dagster_tests.support.factories import make_job, make_user

    user = make_user(db)
    for _ in range(5):
        task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
        make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=60)
    monkeypatch.setenv("RECON_MODE", "shadow")
    defs = make_defs(media_dir, scan_limit=2)
    seen = []
    for _ in range(3):
        tick(defs, instance)
        seen.append(len(_decisions(db)))
    assert seen == [2, 4, 5]  # shadow writes no job row: the scan looks past the decided ones
