"""The backlog against the provider's ceiling (``backlog.py --ceiling``): does the account budget
hold for the whole deployment, and is it used?

A backlog spread over the kinds of two providers (KIE and Replicate), every job's upstream task
already finished, drained by the real ``dagster-daemon`` twice on fresh jobs:

1. **shared**: every run draws on one budget per account through PostgreSQL (``RECON_LIMITS=database``);
2. **per-process**: the same budgets held by each run process on its own (``RECON_LIMITS=process``,
   the limiter as it was before).

The sandbox records a timestamp per provider request; per account the benchmark reports the most
requests in any window of the budget's length (must be at or under the budget), the drain rate as
a fraction of the budget, CPU per job, peak PostgreSQL connections, and the detection latency:
seconds from the moment the jobs became stale (seeded to turn stale ``--lead`` seconds after the
daemon starts) to the first reconcile run of each kind starting.

    .venv/bin/python benchmarks/backlog.py --ceiling [--jobs 2000] [--reads 600] [--window 60]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from harness import Seeded, compile_project, connections, inflight, insert_jobs, log, verify

from recon_dagster.core.kinds import KINDS, get_kind, provider_specs
from recon_dagster.db.engine import (
    DATABASE_URL_ENV,
    dispose_engines,
    get_engine,
    normalize_url,
    redact,
    resolve_database_url,
    with_database,
)
from recon_dagster.db.migrate import migrate
from recon_dagster.providers.limits import Budget
from recon_dagster_tests.support.daemon import daemon_process
from recon_dagster_tests.support.instance import dagster_home, drop_database, ensure_database
from recon_dagster_tests.support.sandbox_process import sandbox_process

PROVIDERS = ("kie", "replicate")
TARGET_DRAIN = 0.9


def kinds_of(provider: str) -> list[str]:
    return [k.name for k in KINDS.values() if str(k.provider) == provider and k.is_async]


def seed_turning_stale(
    engine: sa.Engine, sandbox: Any, count: int, lead_s: float, rng: random.Random
) -> tuple[Seeded, float]:
    """``count`` jobs, half per provider over its async kinds, each turning stale ``lead_s`` from
    now (its kind's threshold minus the lead ago); returns them and the unix time they turn stale."""
    users = [str(uuid.uuid4()) for _ in range(max(1, min(100, count // 20)))]
    ids, kinds, tasks, user_of, ages, specs = [], [], [], [], [], []
    for i in range(count):
        kind = rng.choice(kinds_of(PROVIDERS[i % 2]))
        task_id = f"ceil-{secrets.token_hex(4)}-{i}"
        specs.append((kind, {"outcome": "succeed", "polls_before_done": 0, "media_size": 1024}, task_id))
        ids.append(str(uuid.uuid4()))
        kinds.append(kind)
        tasks.append(task_id)
        user_of.append(users[i % len(users)])
        ages.append(get_kind(kind).stale_threshold.total_seconds() - lead_s)
    sandbox.add_tasks(specs)
    stale_at = time.time() + lead_s
    insert_jobs(engine, ids, user_of, kinds, tasks, ages)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE jobs")
    return Seeded(ids, users, Counter({"completed": count})), stale_at


@dataclass
class CeilingResult:
    mode: str
    jobs: int
    wall_s: float
    cpu_ms_per_job: float
    peak_connections: int
    runs: int
    detection_s: dict[str, float] = field(default_factory=dict)  # kind -> first run start - stale moment
    requested_s: dict[str, float] = field(default_factory=dict)  # kind -> first run created - stale moment
    provider_start_s: dict[str, float] = field(default_factory=dict)  # provider -> first run start - stale
    accounts: dict[str, dict[str, float]] = field(default_factory=dict)


def drain(mode: str, engine, home, sandbox, env: dict[str, str], args) -> tuple[CeilingResult, list[str]]:
    rng = random.Random(args.seed)
    sandbox.reset()
    seeded, stale_at = seed_turning_stale(engine, sandbox, args.jobs, args.lead, rng)
    log(f"  [{mode}] seeded {args.jobs:,} jobs turning stale in {args.lead:g} s")
    with home.instance() as inst:
        before = {r.run_id for r in inst.get_runs()}
    started = time.monotonic()
    peak = 0
    with daemon_process(home, env) as daemon:
        last = 0.0
        while (left := inflight(engine, seeded.job_ids)) > 0:
            peak = max(peak, connections(engine))
            if not daemon.alive():
                raise SystemExit(f"{mode}: the daemon died:\n{daemon.log_tail()}")
            if time.monotonic() - started > args.timeout:
                raise SystemExit(f"{mode}: {left:,} jobs left after {args.timeout:g} s\n{daemon.log_tail()}")
            if time.monotonic() - last >= 15:
                log(
                    f"  [{mode}] {time.monotonic() - started:6.1f} s: {args.jobs - left:,}/{args.jobs:,} terminal"
                )
                last = time.monotonic()
            time.sleep(0.5)
        wall = time.monotonic() - started
        with home.instance() as inst:
            deadline = time.monotonic() + 120
            while not all(r.is_finished for r in inst.get_runs()) and time.monotonic() < deadline:
                time.sleep(0.5)
            records = [
                r
                for r in inst.get_run_records()
                if r.dagster_run.run_id not in before and r.dagster_run.job_name == "reconcile_job"
            ]
        cpu = daemon.cpu_seconds()
    first: dict[str, float] = {}
    requested: dict[str, float] = {}
    by_provider: dict[str, float] = {}
    for rec in records:
        kind = rec.dagster_run.tags.get("recon/provider_kind", "?")
        provider = rec.dagster_run.tags.get("recon/provider", "?")
        requested[kind] = min(requested.get(kind, float("inf")), rec.create_timestamp.timestamp() - stale_at)
        if rec.start_time:
            first[kind] = min(first.get(kind, float("inf")), rec.start_time - stale_at)
            by_provider[provider] = min(by_provider.get(provider, float("inf")), rec.start_time - stale_at)
    result = CeilingResult(
        mode, args.jobs, wall, cpu / args.jobs * 1000, peak, len(records), first, requested, by_provider
    )
    for provider in PROVIDERS:
        seen = sandbox.requests(provider, "read", window_s=args.window)
        stamps = seen["timestamps"]
        span = (max(stamps) - min(stamps)) if len(stamps) > 1 else float("nan")
        result.accounts[provider] = {
            "requests": seen["count"],
            "max_in_window": seen["max_in_window"],
            "budget": args.reads,
            "drain_fraction": seen["count"] / span / (args.reads / args.window)
            if span == span
            else float("nan"),
        }
    return result, [f"{mode}: {p}" for p in verify(engine, seeded)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--reads", type=int, default=600, help="read budget per account per window")
    parser.add_argument("--window", type=float, default=60.0, help="budget window, seconds")
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--sensor-interval", type=int, default=5)
    parser.add_argument(
        "--lead", type=float, default=30.0, help="seconds from daemon start to the jobs turning stale"
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--modes", default="shared,per-process")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.jobs < 2 or args.reads < 1 or args.window <= 0:
        parser.error("--jobs >= 2, --reads >= 1 and --window > 0 please")

    server_url = (
        normalize_url(args.database_url) if args.database_url else resolve_database_url(allow_embedded=True)
    )
    name = f"recon_bench_{secrets.token_hex(4)}"
    ensure_database(server_url, name)
    url = with_database(server_url, name)
    os.environ[DATABASE_URL_ENV] = url
    media_dir = tempfile.mkdtemp(prefix="recon-bench-media-")
    budget = Budget(args.reads, args.window)
    # The run-queue limits of every registered provider, from its spec (as the shipped dagster.yaml).
    provider_runs = {spec.name: spec.run_queue.provider_runs for spec in provider_specs()}
    print(
        f"database {redact(url)}; {args.jobs:,} jobs over {', '.join(PROVIDERS)}; read budget "
        f"{args.reads}/{args.window:g} s per account (bucket {budget.bucket()[0]:.2f}/s, burst {budget.bucket()[1]}); "
        f"latency {args.latency * 1000:g} ms; sensor every {args.sensor_interval} s; runs per provider "
        f"{provider_runs}, <= 2 per kind; {os.cpu_count()} cores",
        flush=True,
    )
    results: list[CeilingResult] = []
    problems: list[str] = []
    try:
        engine = get_engine(url)
        migrate(engine)
        compile_project()
        with (
            sandbox_process(latency_s=args.latency) as sandbox,
            dagster_home(
                url, max_concurrent_runs=10, kind_run_limit=2, provider_run_limits=provider_runs
            ) as home,
        ):
            for mode in args.modes.split(","):
                tag = secrets.token_hex(3)
                env = {
                    **sandbox.env,
                    DATABASE_URL_ENV: url,
                    "RECON_MEDIA_DIR": media_dir,
                    "RECON_SENSOR_INTERVAL_S": str(args.sensor_interval),
                    "RECON_RECONCILE_CONCURRENCY": str(args.concurrency),
                    "RECON_SINGLE_RUN_BELOW": "2",
                    "RECON_LIMITS": "database" if mode == "shared" else "process",
                    # On a loaded machine a run takes more than Dagster's default 60 s to start.
                    "DAGSTER_GRPC_TIMEOUT_SECONDS": "300",
                    "RECON_LIMIT_KIE": f"reads={args.reads}/{args.window:g},account=bench-kie-{tag}",
                    "RECON_LIMIT_REPLICATE": f"reads={args.reads}/{args.window:g},account=bench-rep-{tag}",
                }
                log(f"{mode}: draining")
                result, found = drain(mode, engine, home, sandbox, env, args)
                results.append(result)
                problems += found
            if sandbox.creates_total():
                problems.append("the sandbox saw creates; reconciliation must never create")
    finally:
        dispose_engines()
        drop_database(server_url, name)
        shutil.rmtree(media_dir, ignore_errors=True)

    for r in results:
        acct = "; ".join(
            f"{p}: {a['requests']:,} reads, most in any {args.window:g} s window {a['max_in_window']} "
            f"(budget {a['budget']}{', OVER' if a['max_in_window'] > a['budget'] else ''}), "
            f"drain {a['drain_fraction']:.2f} of budget"
            for p, a in r.accounts.items()
        )
        det = sorted(r.detection_s.values())
        req = sorted(r.requested_s.values())
        prov = ", ".join(f"{p} {s:.1f} s" for p, s in sorted(r.provider_start_s.items()))
        print(
            f"{r.mode}: {r.jobs:,} jobs in {r.wall_s:.1f} s, {r.runs} runs; {acct}; CPU {r.cpu_ms_per_job:.1f} ms/job "
            f"(daemon tree); peak {r.peak_connections} PostgreSQL connections; detection: stale -> run requested "
            f"by the sensor max {req[-1]:.1f} s over {len(req)} kinds; stale -> first run of a provider started: "
            f"{prov}; stale -> first run of a kind started min {det[0]:.1f} s, max {det[-1]:.1f} s (later kinds "
            f"wait in the run queue for their provider's run slots)"
            if det and req
            else f"{r.mode}: no runs recorded"
        )
    shared = next((r for r in results if r.mode == "shared"), None)
    ok = not problems
    if shared is not None:
        over = any(a["max_in_window"] > a["budget"] for a in shared.accounts.values())
        drained = all(a["drain_fraction"] >= TARGET_DRAIN for a in shared.accounts.values())
        # Every kind's run is requested within the bound, and each provider's first run starts within
        # it; the rest of a provider's kinds start as its run slots free (the run queue's tag limits).
        bound = args.sensor_interval + 10
        detect = (
            max(shared.requested_s.values(), default=float("inf")) <= bound
            and max(shared.provider_start_s.values(), default=float("inf")) <= bound
        )
        print(
            f"targets (shared): 0 windows over budget: {'met' if not over else 'NOT met'}; drain >= {TARGET_DRAIN}: "
            f"{'met' if drained else 'NOT met'}; detection (every kind's run requested, each provider's first run "
            f"started) <= sensor interval + 10 s: {'met' if detect else 'NOT met'}"
        )
        ok = ok and not over
    print(
        f"verification: {'OK, every job completed once, credits conserved, 0 creates' if not problems else 'FAILED'}"
    )
    for p in problems:
        print(f"  - {p}")
    print(json.dumps([r.__dict__ for r in results], default=str))
    return 0 if ok else 1
