"""The fault harness: SIGKILL real processes at named crash points, recover through the real CLI,
then check every job against the invariants. Shared by ``benchmarks/chaos.py`` (full runs) and
``recon_dagster_tests/chaos/`` (the fast mode in the default suite).

One *campaign* is, for each crash point (and each path that reaches it: an app worker, or
``recon-dagster reconcile --once``), some *rounds*. A round seeds a batch of jobs with credits
reserved, each with a seeded upstream scenario, and starts one process that works all of them at
once with ``RECON_CRASH_AT=<point>`` and ``RECON_CRASH_HOLD=1``: every job that reaches the point
parks there and the process SIGKILLs itself when the last expected one arrives, so each job is a
trial of "the process died exactly here". After every round, the clock is moved a day forward (all
timestamps of the campaign's rows shifted back) and ``reconcile --once`` runs until nothing is in
flight. Then, per job: terminal, credits settled once and the right way, one upstream create at
most, no media left for a job that did not complete.

Faults without a crash point: ``sandbox.outage`` (poll bursts of 429/5xx past the client's
retries, so the worker gives up mid-job) and ``postgres.restart`` (the embedded server stopped and
started under a running worker).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from recon_dagster_tests.chaos.poison import poison
from recon_dagster_tests.support.harness import SandboxProcess

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
# Poison rows (issue 17): a quarter of a reconcile round's jobs hold a value Python or an int4
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
from recon_dagster.db.engine import get_engine
from recon_dagster.media.store import media_store_from_env
from recon_dagster.providers import providers_from_env
from recon_dagster.providers.status import UpstreamState
from recon_dagster.reconcile.finalize import ProviderResult, fail_and_refund, finalize_job_with_media
from recon_dagster.reconcile.app_worker import run_or_resume

specs = json.load(open(sys.argv[1]))
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


@dataclass
class RoundResult:
    case: str
    seed: int
    jobs: int
    expected_hits: int
    hits: int
    returncode: int | None
    killed_at_point: bool
    killed_by_harness: bool
    seconds: float
    inflight_after: int  # jobs the dead process left in flight (work for recovery)


@dataclass
class PointReport:
    """The Jepsen-style row of one crash point (one path)."""

    case: str
    trials: int = 0
    completed: int = 0
    failed_refunded: int = 0
    lost: int = 0
    double_commits: int = 0
    double_refunds: int = 0
    mismatched: int = 0  # completed but refunded, failed but charged, completed without media
    duplicate_creates: int = 0
    leftover_objects: int = 0
    leftover_parts: int = 0
    rounds: int = 0
    killed_at_point: int = 0
    seeds: list[int] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)  # job ids of violations, for reproduction

    @property
    def violations(self) -> int:
        return (
            self.lost + self.double_commits + self.double_refunds + self.mismatched
            + self.duplicate_creates + self.leftover_objects + self.leftover_parts
        )  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "violations": self.violations}


# --- seeding -----------------------------------------------------------------------------------


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


# --- processes ---------------------------------------------------------------------------------


def _script(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def base_env(database_url: str, sandbox: SandboxProcess, media_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECON_CRASH_")}
    env.pop("DAGSTER_HOME", None)  # reconcile --once on a throwaway instance
    env.update(sandbox.env)
    env.update({"RECON_DATABASE_URL": database_url, "RECON_MEDIA_DIR": str(media_dir)})
    return env


def run_crashing(
    cmd: list[str], env: Mapping[str, str], *, timeout_s: float, log: Path
) -> tuple[int | None, bool, str]:
    """Run until the process dies; SIGKILL it ourselves after ``timeout_s``.

    Returns (returncode, killed by us, output tail)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, env=dict(env), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        killed = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return proc.returncode, killed, log.read_bytes()[-3000:].decode("utf-8", "replace")


def shift_clock(engine: sa.Engine, ids: Iterable[uuid.UUID], by: str = "1 day") -> None:
    """Move time forward for these rows: every timestamp the scan, lease and cadence read."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"""
                UPDATE jobs SET
                  provider_call_started_at = provider_call_started_at - interval '{by}',
                  started_at = started_at - interval '{by}',
                  created_at = created_at - interval '{by}',
                  reconcile_lease_expires_at = reconcile_lease_expires_at - interval '{by}',
                  reconcile_next_at = reconcile_next_at - interval '{by}'
                WHERE id = ANY(CAST(:ids AS uuid[]))
                """
            ),
            {"ids": [str(i) for i in ids]},
        )


def reconcile_env(base: Mapping[str, str], concurrency: int) -> dict[str, str]:
    """Knobs for `reconcile --once` in the harness: short cadence and attempt cap, one batch."""
    return {
        **base,
        "RECON_MAX_ATTEMPTS": "2",
        "RECON_RECONCILE_CADENCE_S": "0",
        "RECON_SINGLE_RUN_BELOW": "1",
        "RECON_BATCH_SIZE": str(max(concurrency, 1)),
        "RECON_RECONCILE_CONCURRENCY": str(max(concurrency, 1)),
        "RECON_DB_POOL_SIZE": str(concurrency + 4),
        "RECON_LEASE_S": "120",
    }


def inflight(engine: sa.Engine, ids: Sequence[uuid.UUID]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    """
                    SELECT count(*) FROM jobs j
                    WHERE j.id = ANY(CAST(:ids AS uuid[]))
                      AND (j.status IN ('pending', 'processing')
                           OR EXISTS (SELECT 1 FROM usage_logs u WHERE u.job_id = j.id AND u.status = 'reserved'))
                    """
                ),
                {"ids": [str(i) for i in ids]},
            ).scalar_one()
        )


def recover(
    engine: sa.Engine, ids: Sequence[uuid.UUID], env: Mapping[str, str], workdir: Path, *, max_passes: int = 6
) -> int:
    """`recon-dagster reconcile --once` (a day later each time) until nothing is in flight."""
    passes = 0
    while passes < max_passes and inflight(engine, ids):
        shift_clock(engine, ids)
        passes += 1
        done = subprocess.run(
            [_script("recon-dagster"), "reconcile", "--once"],
            env=dict(env), capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        (workdir / f"recover-{passes}.log").write_text(done.stdout + done.stderr)
    return passes


# --- one round ---------------------------------------------------------------------------------


def run_round(
    engine: sa.Engine,
    database_url: str,
    sandbox: SandboxProcess,
    media_dir: Path,
    workdir: Path,
    case: str,
    seed: int,
    n: int,
    *,
    timeout_s: float = 300,  # generous: a loaded 2-core machine runs 25 threads slowly
) -> tuple[list[Job], RoundResult]:
    """Seed ``n`` jobs and run one process over them armed at the case's point; it dies."""
    path, point = case.split(":", 1)
    rng = random.Random(seed)
    jobs, specs = seed_jobs(engine, sandbox, rng, n, case)
    hits_needed = expected_hits(point, jobs, path)
    crash_log = workdir / f"crash-{seed}.log"
    env = base_env(database_url, sandbox, media_dir)
    if point not in FAULTS and hits_needed:
        env.update(
            {
                "RECON_CRASH_AT": point,
                "RECON_CRASH_HITS": str(hits_needed),
                "RECON_CRASH_HOLD": "1",
                "RECON_CRASH_LOG": str(crash_log),
                "RECON_CRASH_SEED": str(seed),
            }
        )
    started = time.monotonic()
    if path == "worker":
        spec_file = workdir / f"specs-{seed}.json"
        spec_file.write_text(json.dumps(specs))
        env["RECON_DB_POOL_SIZE"] = str(n + 4)
        cmd = [sys.executable, "-c", WORKER_SCRIPT, str(spec_file)]
    else:
        shift_clock(engine, [j.id for j in jobs])  # this round's jobs, and only they, are due
        if point in POISONS:
            poison(engine, rng, jobs, point)
        # Long cadence and lease: a job this run bumps or leases is not due again until recovery.
        env = {**reconcile_env(env, n), "RECON_RECONCILE_CADENCE_S": "3600", "RECON_LEASE_S": "3600"}
        cmd = [_script("recon-dagster"), "reconcile", "--once"]
    rc, by_harness, _tail = run_crashing(cmd, env, timeout_s=timeout_s, log=workdir / f"round-{seed}.log")
    hits = len(crash_log.read_text().splitlines()) if crash_log.exists() else 0
    result = RoundResult(
        case, seed, n, hits_needed, hits, rc,
        killed_at_point=rc == -signal.SIGKILL and not by_harness and hits >= hits_needed > 0,
        killed_by_harness=by_harness, seconds=round(time.monotonic() - started, 2),
        inflight_after=inflight(engine, [j.id for j in jobs]),
    )  # fmt: skip
    return jobs, result


# --- the checks --------------------------------------------------------------------------------


def media_files(media_dir: Path) -> list[Path]:
    return [p for p in media_dir.rglob("*") if p.is_file()]


def check(
    engine: sa.Engine, sandbox: SandboxProcess, media_dir: Path, jobs: Sequence[Job]
) -> dict[str, PointReport]:
    """Every job against the invariants, grouped by case."""
    reports: dict[str, PointReport] = {}
    files = media_files(media_dir)
    by_job: dict[str, list[Path]] = {}
    for f in files:
        for part in f.parts:
            by_job.setdefault(part, []).append(f)
    with engine.connect() as conn:
        rows = {
            str(r.id): r
            for r in conn.execute(
                sa.text(
                    """
                    SELECT j.id, j.status,
                      (SELECT array_agg(u.status::text) FROM usage_logs u WHERE u.job_id = j.id) AS usage,
                      uc.subscription_credits + uc.topup_credits AS balance,
                      (SELECT count(*) FROM assets a WHERE a.job_id = j.id) AS assets
                    FROM jobs j JOIN user_credits uc ON uc.user_id = j.user_id
                    WHERE j.id = ANY(CAST(:ids AS uuid[]))
                    """
                ),
                {"ids": [str(j.id) for j in jobs]},
            )
        }
    creates = sandbox_creates(sandbox, [j.id for j in jobs])
    for job in jobs:
        rep = reports.setdefault(job.case, PointReport(job.case))
        rep.trials += 1
        row = rows[str(job.id)]
        usage = list(row.usage or [])
        balance = Decimal(row.balance)
        bad: list[str] = []
        if row.status in ("pending", "processing") or "reserved" in usage:
            rep.lost += 1
            bad.append("lost")
        elif row.status == "completed" and usage == ["committed"]:
            rep.completed += 1
        elif row.status in ("failed", "cancelled") and usage == ["refunded"]:
            rep.failed_refunded += 1
        else:
            rep.mismatched += 1
            bad.append(f"mismatch {row.status}/{usage}")
        charged = START_BALANCE - balance
        expected = job.amount if "committed" in usage else Decimal(0)
        if charged > expected:
            rep.double_commits += 1
            bad.append(f"charged {charged} expected {expected}")
        elif charged < expected or (charged < 0):
            rep.double_refunds += 1
            bad.append(f"charged {charged} expected {expected}")
        objects = [f for f in by_job.get(str(job.id), []) if not f.name.endswith(".part")]
        parts = [f for f in by_job.get(str(job.id), []) if f.name.endswith(".part")]
        if row.status == "completed" and (not objects or row.assets != 1):
            rep.mismatched += 1
            bad.append(f"completed with {len(objects)} objects, {row.assets} assets")
        if row.status != "completed" and objects:
            rep.leftover_objects += 1
            bad.append(f"{len(objects)} media objects left")
        if parts:
            rep.leftover_parts += 1
            bad.append(f"{len(parts)} .part files left")
        allowed = 1 if job.case.startswith("worker:") else 0
        if creates.get(str(job.id), 0) > allowed:
            rep.duplicate_creates += 1
            bad.append(f"{creates[str(job.id)]} upstream creates")
        if bad and len(rep.examples) < 5:
            rep.examples.append(f"{job.id}: {'; '.join(bad)}")
    return reports


def sandbox_creates(sandbox: SandboxProcess, ids: Sequence[uuid.UUID]) -> dict[str, int]:
    """Upstream creates per job id (the worker's create body carries the job id)."""
    return {str(i): sandbox.creates_for(str(i)) for i in ids}


# --- a campaign ----------------------------------------------------------------------------------


@dataclass
class Campaign:
    seed: int
    jobs_per_round: int
    rounds_per_case: int
    cases: tuple[tuple[str, str], ...] = CASES
    reports: dict[str, PointReport] = field(default_factory=dict)
    rounds: list[RoundResult] = field(default_factory=list)
    recovery_passes: int = 0
    seconds: float = 0.0


def round_seed(campaign_seed: int, case_index: int, round_index: int) -> int:
    return campaign_seed * 100_000 + case_index * 1000 + round_index


def run_campaign(
    engine: sa.Engine,
    database_url: str,
    sandbox: SandboxProcess,
    media_dir: Path,
    *,
    seed: int,
    jobs_per_round: int,
    rounds_per_case: int,
    cases: Sequence[tuple[str, str]] = CASES,
    workdir: Path | None = None,
    progress: Any = None,
    parallel: int = 2,
    on_sweep: Any = None,
) -> Campaign:
    """``rounds_per_case`` sweeps; a sweep is one round of every case, then one recovery over all
    of their jobs, then the checks. ``parallel`` worker rounds run at once."""
    started = time.monotonic()
    campaign = Campaign(seed, jobs_per_round, rounds_per_case, tuple(cases))
    work = Path(workdir or tempfile.mkdtemp(prefix="recon-chaos-"))
    env = reconcile_env(base_env(database_url, sandbox, media_dir), jobs_per_round)
    for r in range(rounds_per_case):
        # One sweep: a round of every case, then one recovery over all of their jobs.
        sweep: list[Job] = []
        results: dict[str, RoundResult] = {}

        def one(path: str, point: str, r: int = r) -> tuple[list[Job], RoundResult]:
            # Indexed in CASES, so a round's seed is the same whichever cases a run selects.
            seed_r = round_seed(seed, CASES.index((path, point)), r)
            return run_round(
                engine, database_url, sandbox, media_dir, work, f"{path}:{point}", seed_r, jobs_per_round
            )

        # `reconcile --once` works every due job, so those rounds run one at a time; worker rounds
        # touch only their own jobs and may overlap.
        done = [one(p, q) for p, q in cases if p == "reconcile"]
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            done += list(pool.map(lambda c: one(*c), [c for c in cases if c[0] != "reconcile"]))
        for jobs, result in done:
            campaign.rounds.append(result)
            results[result.case] = result
            sweep.extend(jobs)
        campaign.recovery_passes += recover(engine, [j.id for j in sweep], env, work)
        for case, rep in check(engine, sandbox, media_dir, sweep).items():
            total = campaign.reports.setdefault(case, PointReport(case))
            merge(total, rep)
            total.rounds += 1
            total.killed_at_point += int(results[case].killed_at_point)
            total.seeds.append(results[case].seed)
            if progress is not None:
                progress(results[case], total)
        campaign.seconds = round(time.monotonic() - started, 1)
        if on_sweep is not None:
            on_sweep(campaign)  # a long run's partial results survive an interruption
    campaign.seconds = round(time.monotonic() - started, 1)
    return campaign


def merge(into: PointReport, rep: PointReport) -> None:
    for name in (
        "trials", "completed", "failed_refunded", "lost", "double_commits", "double_refunds",
        "mismatched", "duplicate_creates", "leftover_objects", "leftover_parts",
    ):  # fmt: skip
        setattr(into, name, getattr(into, name) + getattr(rep, name))
    into.examples.extend(rep.examples[: max(0, 5 - len(into.examples))])


TABLE_HEADER = (
    "| crash point | path | trials | completed | failed+refunded | lost | double commits | double refunds "
    "| duplicate creates | leftover objects (.part) | killed at point | seed |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def table(campaign: Campaign) -> str:
    """The per-point report as a Markdown table."""
    lines = [TABLE_HEADER]
    for case, rep in campaign.reports.items():
        path, point = case.split(":", 1)
        lines.append(
            f"| `{point}` | {path} | {rep.trials} | {rep.completed} | {rep.failed_refunded} | {rep.lost} "
            f"| {rep.double_commits} | {rep.double_refunds} | {rep.duplicate_creates} "
            f"| {rep.leftover_objects} ({rep.leftover_parts}) | {rep.killed_at_point}/{rep.rounds} "
            f"| {campaign.seed} |"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def temp_media_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="recon-chaos-media-") as d:
        yield Path(d)
