"""The fault harness's worlds: the crash points and faults it covers (``CASES``), the app worker
it runs (``WORKER_SCRIPT``), and the seeded jobs, credits and upstream scenarios of a round."""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from recon_dagster_tests.support.sandbox_process import SandboxProcess

KIND = "kie-standard"
START_BALANCE = Decimal("150")  # 100 subscription + 50 top-up per user (one user per job)

# (point, path): the worker path is an app worker process, the reconcile path `reconcile --once`.
WORKER_POINTS = (
    "worker.after_create",
    "worker.after_persist",
    "worker.mid_poll",
    "media.mid_download",
    "finalize.after_upload",
    "finalize.in_settle",
    "finalize.after_commit",
    "refund.in_settle",
)
RECONCILE_POINTS = (
    "reconcile.after_poll",
    "media.mid_download",
    "finalize.after_upload",
    "finalize.in_settle",
    "finalize.after_commit",
    "refund.in_settle",
)
# Poison rows: a quarter of a reconcile round's jobs hold a value Python or an int4
# cannot carry on; their batch-mates must settle all the same, and so must they.
POISONS = ("poison.timestamp", "counter.max")
FAULTS = ("sandbox.outage", "postgres.restart", *POISONS)
# Reconcile-path rounds come first in a sweep: a worker round's jobs are fresh (not yet stale), so a
# later `reconcile --once` that is meant to die over its own round never picks them up.
CASES: tuple[tuple[str, str], ...] = (
    *(("reconcile", p) for p in RECONCILE_POINTS),
    *(("worker", p) for p in WORKER_POINTS),
    ("worker", "sandbox.outage"),
    *(("reconcile", p) for p in POISONS),
)

# What an app worker does, for many jobs at once (one thread each): create or resume the upstream
# task, poll it (the on_progress hook is the worker's mid-poll crash point), then finalize or fail.
WORKER_SCRIPT = r"""
import json, sys, threading
from recon_dagster.core.crashpoints import crash_point
from recon_dagster.db.engine import get_engine, limit_pool
from recon_dagster.media.store import media_store_from_env
from recon_dagster.providers import providers_from_env
from recon_dagster.providers.status import UpstreamState
from recon_dagster.reconcile.finalize import ProviderResult, fail_and_refund, finalize_job_with_media
from recon_dagster.reconcile.app_worker import run_or_resume

specs = json.load(open(sys.argv[1]))
# One thread per app worker, each may be parked at a crash point inside a transaction: the
# connections of that many app worker processes (2 each would be the budget's), with room to spare.
limit_pool(len(specs) + 4)
providers, engine, store = providers_from_env(), get_engine(), media_store_from_env()

def work(spec):
    job_id, kind = spec["job_id"], spec["kind"]
    payload = {"model": "flux-dev", "sandbox_kind": kind, "input": {"prompt": "chaos"},
               "callBackUrl": f"https://app.example/callbacks/{job_id}",
               "sandbox_scenario": spec["scenario"]}
    try:
        status = run_or_resume(job_id, kind, lambda cb: providers.run(
            kind, payload, on_task_created=cb, on_progress=lambda s: crash_point("worker.mid_poll"),
            poll_interval_s=0.05, budget_s=30), providers=providers)
        if status.state is UpstreamState.SUCCEEDED:
            finalize_job_with_media(engine, store, job_id, ProviderResult.from_status(status),
                                    source="worker")
        elif status.terminal:
            fail_and_refund(engine, job_id, f"upstream {status.state.value}")
    except Exception as exc:  # the job stays in flight; reconciliation's business now
        print(f"job {job_id}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)

threads = [threading.Thread(target=work, args=(s,)) for s in specs]
for t in threads: t.start()
for t in threads: t.join()
print("worker done", flush=True)
"""


@dataclass
class Job:
    id: uuid.UUID
    user_id: uuid.UUID
    amount: Decimal
    outcome: str  # the scenario's outcome: succeed / fail / run_forever
    case: str  # "<path>:<point>"


def scenario_for(rng: random.Random, point: str, path: str) -> dict[str, Any]:
    """A seeded upstream scenario that makes the job reach ``point`` (and a mix elsewhere)."""
    if point == "refund.in_settle":
        outcome = "fail"
    elif point in (
        "media.mid_download",
        "finalize.after_upload",
        "finalize.in_settle",
        "finalize.after_commit",
    ):
        outcome = "succeed"
    else:
        outcome = rng.choices(["succeed", "fail", "run_forever"], weights=[7, 2, 1])[0]
    scenario: dict[str, Any] = {
        "outcome": outcome,
        "polls_before_done": rng.randint(0, 2) if path == "reconcile" else rng.randint(1, 3),
        "media_size": rng.choice([48 * 1024, 200 * 1024, 600 * 1024]),
        "retry_after_s": 0,
    }
    if point == "sandbox.outage":
        # Bursts past the worker's 5 attempts per poll: it gives up; reconciliation finishes later.
        scenario["rate_limit_first"] = rng.randint(0, 3)
        scenario["server_error_first"] = rng.randint(3, 8)
    elif rng.random() < 0.3:
        scenario["rate_limit_first"] = rng.randint(0, 1)
        scenario["server_error_first"] = rng.randint(0, 1)
    if path == "reconcile":
        scenario["polls_before_done"] = 0 if outcome != "run_forever" else 1
    return scenario


def seed_jobs(
    engine: sa.Engine, sandbox: SandboxProcess, rng: random.Random, n: int, case: str
) -> tuple[list[Job], list[dict[str, Any]]]:
    """``n`` processing jobs with credits reserved; for the reconcile path their upstream tasks
    exist already (a dead worker made them). Returns the jobs and the worker's specs."""
    from recon_dagster.db.credits import reserve_credits_for_job

    path, point = case.split(":", 1)
    jobs: list[Job] = []
    specs: list[dict[str, Any]] = []
    tasks: list[tuple[str, Mapping[str, Any] | None, str | None]] = []
    with engine.begin() as conn:
        for _ in range(n):
            scenario = scenario_for(rng, point, path)
            user_id = uuid.uuid4()
            conn.execute(
                sa.text(
                    "INSERT INTO user_credits (user_id, subscription_credits, topup_credits) VALUES (:u, 100, 50)"
                ),
                {"u": str(user_id)},
            )
            task_id = None
            if path == "reconcile":
                task_id = f"chaos-{uuid.uuid4().hex}"
                tasks.append((KIND, scenario, task_id))
            job_id = uuid.UUID(
                str(
                    conn.execute(
                        sa.text(
                            """
                            INSERT INTO jobs (user_id, job_type, status, input_data, should_watermark,
                              provider_kind, provider_task_id, provider_call_started_at, started_at)
                            VALUES (:u, 'image', 'processing', '{}'::jsonb, :wm, :k, :t,
                              CASE WHEN CAST(:t AS text) IS NULL THEN NULL ELSE now() END, now())
                            RETURNING id
                            """
                        ),
                        {
                            "u": str(user_id),
                            "wm": rng.random() < 0.3,
                            "k": KIND if task_id else None,
                            "t": task_id,
                        },
                    ).scalar_one()
                )
            )
            amount = Decimal(rng.randint(1, 40))
            reserve_credits_for_job(conn, job_id, user_id, amount)
            jobs.append(Job(job_id, user_id, amount, scenario["outcome"], case))
            specs.append({"job_id": str(job_id), "kind": KIND, "scenario": scenario})
    if tasks:
        sandbox.add_tasks(tasks, workers=4)
    return jobs, specs


def expected_hits(point: str, jobs: Sequence[Job], path: str) -> int:
    """How many jobs of the round reach ``point`` (each parks there once)."""
    if point in ("worker.after_create", "worker.after_persist", "worker.mid_poll", "reconcile.after_poll"):
        return len(jobs)
    if point == "refund.in_settle":
        return sum(j.outcome == "fail" for j in jobs)
    if point in FAULTS:
        return 0
    return sum(j.outcome == "succeed" for j in jobs)
