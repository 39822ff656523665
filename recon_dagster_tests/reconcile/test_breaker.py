"""A burst of "not found" is a misconfiguration, not lost tasks.

Real PostgreSQL, the loopback sandbox over real HTTP (a task id the sandbox never issued is what a
wrong account or base path looks like: KIE answers 422 "recordInfo is null", Replicate and
ElevenLabs 404 in their own error shapes), and two processes, each with its own engine, polling at
once: the second is a separate Python process running the same Reconciler.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from decimal import Decimal

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.defs.observe.answers import no_not_found_burst
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.defs.settings_check import BURST_ENV, SHARE_ENV, WINDOW_ENV, breaker_policy
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.breaker import NotFoundBreaker, provider_windows
from recon_dagster.reconcile.decide import BreakerPolicy, Outcome
from recon_dagster.reconcile.reconciler import Reconciler, ReconcileSettings
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.answers import lease, stale_job
from recon_dagster_tests.support.factories import balances, job_row
from recon_dagster_tests.support.reconcile import count, one, statements_like, usage_status

# One async kind per provider that has tasks to poll.
KIND_OF = {"kie": "kie-veo", "replicate": "replicate-prediction", "elevenlabs": "elevenlabs-async"}


def _stale(db, kind, *, task_id=None, attempts=0):
    return stale_job(db, kind, "video", attempts=attempts, task_id=task_id)


def _reconciler(db: sa.Engine, media_dir: str, **kw) -> Reconciler:
    return Reconciler(
        db, providers_from_env(), LocalMediaStore(base_dir=media_dir), settings=ReconcileSettings(), **kw
    )


def _work(db: sa.Engine, media_dir: str, jobs: list[uuid.UUID], **kw) -> list:
    owner = f"run-{uuid.uuid4().hex[:8]}"
    lease(db, jobs, owner)
    return _reconciler(db, media_dir, **kw).reconcile_many(jobs, owner)


def _statuses(db: sa.Engine, jobs: list[uuid.UUID]) -> dict[str, int]:
    rows = one(db, "SELECT json_object_agg(s, n) FROM (SELECT status s, count(*) n FROM jobs "
                   "WHERE id = ANY(CAST(:ids AS uuid[])) GROUP BY status) t", ids=[str(j) for j in jobs])  # fmt: skip
    return dict(rows or {})


def _check(db: sa.Engine) -> dg.AssetCheckResult:
    return no_not_found_burst(database=DatabaseResource())


# --- one genuine not-found still fails and refunds at once ---------------------------------------


@pytest.mark.parametrize("provider", sorted(KIND_OF))
def test_a_single_genuine_not_found_fails_and_refunds_at_once(db, sandbox, media_dir, provider):
    # Its neighbours answer normally: the provider is configured right and this task is just gone.
    running = [
        _stale(db, KIND_OF[provider], task_id=sandbox.add_task(KIND_OF[provider], Scenario(outcome="run_forever")))[1]
        for _ in range(3)
    ]  # fmt: skip
    user, lost = _stale(db, KIND_OF[provider])

    outcomes = {o.job_id: o for o in _work(db, media_dir, [*running, lost])}

    assert outcomes[lost].outcome is Outcome.FAILED, outcomes[lost].detail
    assert job_row(db, lost)["status"] == "failed" and usage_status(db, lost) == "refunded"
    assert balances(db, user) == (Decimal(100), Decimal(50))
    assert _check(db).passed


# --- a burst, from two processes at once --------------------------------------------------------

_OTHER_PROCESS = """
import json, sys
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.reconciler import ReconcileSettings, Reconciler
from recon_dagster.db.engine import get_engine

jobs, owner, media_dir = json.loads(sys.argv[1])
rec = Reconciler(get_engine(), providers_from_env(), LocalMediaStore(base_dir=media_dir), settings=ReconcileSettings())
print("ready", flush=True)
sys.stdin.readline()
outcomes = rec.reconcile_many(jobs, owner)
print(json.dumps([o.outcome.value for o in outcomes]), flush=True)
"""


def _start_other_process(db: sa.Engine, media_dir: str, jobs: list[uuid.UUID]) -> subprocess.Popen:
    owner = f"run-other-{uuid.uuid4().hex[:8]}"
    lease(db, jobs, owner)
    proc = subprocess.Popen(
        [sys.executable, "-c", _OTHER_PROCESS, json.dumps([[str(j) for j in jobs], owner, media_dir])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("provider", sorted(KIND_OF))
@pytest.mark.slow
def test_a_burst_of_not_found_from_two_processes_fails_at_most_the_burst_threshold(
    db, sandbox, media_dir, provider, caplog
):
    kind = KIND_OF[provider]
    jobs = [_stale(db, kind)[1] for _ in range(48)]
    here, there = jobs[::2], jobs[1::2]
    other = _start_other_process(db, media_dir, there)

    with caplog.at_level(logging.ERROR, logger="recon_dagster.reconcile.breaker"):
        assert other.stdin is not None
        other.stdin.write("go\n")
        other.stdin.flush()
        local = _work(db, media_dir, here)
        remote, _ = other.communicate(timeout=300)
    assert other.returncode == 0

    outcomes = [o.outcome.value for o in local] + json.loads(remote.strip().splitlines()[-1])
    failed = outcomes.count(Outcome.FAILED.value)
    # Only answers that commit among the first `burst` can see a closed breaker (see breaker.py).
    assert failed <= breaker_policy().burst, outcomes
    assert outcomes.count(Outcome.ERROR.value) == len(jobs) - failed
    statuses = _statuses(db, jobs)
    assert statuses.get("failed", 0) == failed and statuses["processing"] == len(jobs) - failed
    for job in jobs:
        row = job_row(db, job)
        if row["status"] == "processing":
            assert row["reconcile_attempts"] == 1 and "breaker is open" in row["reconcile_last_error"]
            assert usage_status(db, job) == "reserved"
    # Loud: ERROR lines naming the provider, and a failing asset check.
    assert any(r.levelno == logging.ERROR and provider in r.getMessage() for r in caplog.records)
    check = _check(db)
    assert not check.passed and check.severity is dg.AssetCheckSeverity.ERROR
    # Open for the provider as a whole and for the kind that burst (per kind).
    assert check.metadata["open_for"].value == [provider, kind]
    # Other providers are not affected: a lone not-found elsewhere still fails at once.
    other_provider = next(p for p in sorted(KIND_OF) if p != provider)
    _, lone = _stale(db, KIND_OF[other_provider])
    assert _work(db, media_dir, [lone])[0].outcome is Outcome.FAILED


def test_with_the_breaker_open_the_attempt_cap_still_ends_the_job(db, sandbox, media_dir):
    _work(db, media_dir, [_stale(db, "replicate-prediction")[1] for _ in range(10)])
    user, last = _stale(db, "replicate-prediction", attempts=17)

    out = _work(db, media_dir, [last])[0]

    assert out.outcome is Outcome.EXHAUSTED, out.detail
    assert job_row(db, last)["status"] == "failed" and usage_status(db, last) == "refunded"
    assert balances(db, user) == (Decimal(100), Decimal(50))
    assert count(db, "credit_anomalies", last) == 1


def test_the_breaker_closes_once_the_burst_leaves_the_window(db, sandbox, media_dir):
    _work(db, media_dir, [_stale(db, "kie-veo")[1] for _ in range(10)])
    assert not _check(db).passed
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE provider_poll_answers SET at = at - interval '11 minutes'"))
    assert _check(db).passed

    _, lost = _stale(db, "kie-veo")
    assert _work(db, media_dir, [lost])[0].outcome is Outcome.FAILED
    # Recording prunes what has left the window.
    assert one(db, "SELECT count(*) FROM provider_poll_answers WHERE at < now() - interval '10 minutes'") == 0


@pytest.mark.slow
def test_a_burst_that_is_not_most_of_the_answers_does_not_open_the_breaker(db, sandbox, media_dir):
    # 30 healthy answers, then 8 genuinely lost tasks: a bad batch, not a bad configuration.
    running = [
        _stale(db, "kie-veo", task_id=sandbox.add_task("kie-veo", Scenario(outcome="run_forever")))[1]
        for _ in range(30)
    ]
    _work(db, media_dir, running)
    lost = [_stale(db, "kie-veo")[1] for _ in range(8)]

    assert {o.outcome for o in _work(db, media_dir, lost)} == {Outcome.FAILED}
    assert _check(db).passed


def test_the_health_job_runs_the_check_and_it_fails_during_a_burst(db, sandbox, media_dir, instance):
    from recon_dagster_tests.support.reconcile import make_defs

    _work(db, media_dir, [_stale(db, "elevenlabs-async")[1] for _ in range(10)])

    job = make_defs(media_dir).resolve_job_def("reconcile_health_job")
    result = job.execute_in_process(instance=instance)

    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations["no_not_found_burst"].passed is False


def test_breaker_breaker_policy(monkeypatch):
    assert breaker_policy({}) == BreakerPolicy()
    env = {BURST_ENV: "20", SHARE_ENV: "0.8", WINDOW_ENV: "120"}
    assert breaker_policy(env) == BreakerPolicy(burst=20, share=0.8, window_s=120.0)
    for name, bad in ((BURST_ENV, "x"), (BURST_ENV, "-1"), (SHARE_ENV, "1.5"), (WINDOW_ENV, "0")):
        with pytest.raises(ValueError, match=name):
            breaker_policy({name: bad})


def test_a_smaller_configured_burst_opens_sooner(db, sandbox, media_dir):
    breaker = NotFoundBreaker(db, BreakerPolicy(burst=1))
    jobs = [_stale(db, "kie-veo")[1] for _ in range(6)]
    outcomes = [o.outcome for o in _work(db, media_dir, jobs, breaker=breaker)]
    assert outcomes.count(Outcome.FAILED) <= 1 and outcomes.count(Outcome.ERROR) >= 5
    with db.connect() as conn:
        assert [(w.name, w.is_open) for w in provider_windows(conn, breaker.policy)] == [
            ("kie", True),
            ("kie-veo", True),
        ]


# --- answers that cannot open the breaker are written in batches ----------------------------------


@pytest.mark.slow
def test_found_answers_are_recorded_in_a_few_statements_and_all_counted(db, sandbox, media_dir):
    # One INSERT per poll was a transaction per poll (about 6% of a backlog run's CPU); a found
    # answer can only lower the not-found share, so it may wait for a batch.
    running = [
        _stale(db, "kie-veo", task_id=sandbox.add_task("kie-veo", Scenario(outcome="run_forever")))[1]
        for _ in range(120)
    ]
    with statements_like(db, "INSERT INTO provider_poll_answers") as inserts:
        _work(db, media_dir, running)
    assert 1 <= len(inserts) <= len(running) // 5  # a batch per 50 answers or per second
    with db.connect() as conn:
        assert {w.provider: w.answers for w in provider_windows(conn, BreakerPolicy())} == {"kie": 120}


@pytest.mark.slow
def test_a_not_found_is_judged_against_the_found_answers_before_it(db, sandbox, media_dir, monkeypatch):
    # This process's held found answers are written before a not-found is counted, so a healthy
    # batch with a few lost tasks does not look like a burst (and fails those tasks). One thread,
    # so the found answers come first; no time-based flush, so only that ordering can save them.
    monkeypatch.setattr("recon_dagster.reconcile.breaker.FLUSH_AFTER_S", 3600.0)
    breaker = NotFoundBreaker(db, BreakerPolicy(burst=2, share=0.5))
    running = [
        _stale(db, "kie-veo", task_id=sandbox.add_task("kie-veo", Scenario(outcome="run_forever")))[1]
        for _ in range(20)
    ]
    lost = [_stale(db, "kie-veo")[1] for _ in range(4)]
    owner = f"run-{uuid.uuid4().hex[:8]}"
    lease(db, running + lost, owner)
    rec = Reconciler(
        db, providers_from_env(), LocalMediaStore(base_dir=media_dir),
        settings=ReconcileSettings(concurrency=1), breaker=breaker,
    )  # fmt: skip
    outcomes = {o.job_id: o.outcome for o in rec.reconcile_many(running + lost, owner)}
    assert {outcomes[j] for j in lost} == {Outcome.FAILED}
    assert {outcomes[j] for j in running} == {Outcome.STILL_RUNNING}


# --- not-found is counted per kind -----------------------------------------------


@pytest.mark.parametrize(
    ("healthy", "bursting"),
    [
        ("replicate-prediction", "replicate-training"),  # the scenario
        ("replicate-training", "replicate-prediction"),
        ("kie-veo", "kie-runway"),
    ],
)
@pytest.mark.slow
def test_not_found_breaker_counts_per_kind_whatever_the_providers_other_traffic(
    db, sandbox, media_dir, healthy, bursting
):
    # 40 healthy answers of one kind fill the provider's window; then 15 tasks of a sibling kind
    # of the same provider answer not-found. The healthy traffic must not dilute that burst.
    burst = breaker_policy().burst
    running = [
        _stale(db, healthy, task_id=sandbox.add_task(healthy, Scenario(outcome="run_forever")))[1]
        for _ in range(40)
    ]
    assert {o.outcome for o in _work(db, media_dir, running)} == {Outcome.STILL_RUNNING}
    lost = [_stale(db, bursting)[1] for _ in range(15)]

    outcomes = [o.outcome for o in _work(db, media_dir, lost)]

    assert outcomes.count(Outcome.FAILED) <= burst, outcomes
    assert outcomes.count(Outcome.ERROR) == 15 - outcomes.count(Outcome.FAILED)
    assert _statuses(db, lost).get("failed", 0) <= burst
    check = _check(db)
    assert not check.passed and bursting in check.metadata["open_for"].value
    assert healthy not in check.metadata["open_for"].value
    # The healthy kind is not held: a lone genuine not-found of it still fails at once.
    _, lone = _stale(db, healthy)
    assert _work(db, media_dir, [lone])[0].outcome is Outcome.FAILED


def test_not_found_breaker_per_kind_with_traffic_of_other_providers_and_kinds(db, sandbox, media_dir):
    # Healthy traffic of every other provider and of two sibling kinds, interleaved with the burst
    # in one batch: still at most the burst of the bursting kind fails.
    burst = breaker_policy().burst
    healthy = [
        _stale(db, kind, task_id=sandbox.add_task(kind, Scenario(outcome="run_forever")))[1]
        for kind in ("replicate-prediction", "kie-veo", "elevenlabs-async", "kie-standard") * 10
    ]
    lost = [_stale(db, "replicate-training")[1] for _ in range(15)]
    batch = [j for pair in zip(healthy[:15], lost, strict=True) for j in pair] + healthy[15:]

    outcomes = {o.job_id: o.outcome for o in _work(db, media_dir, batch)}

    assert [outcomes[j] for j in lost].count(Outcome.FAILED) <= burst
    assert {outcomes[j] for j in healthy} == {Outcome.STILL_RUNNING}
