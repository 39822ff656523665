"""A fresh stuck job during another kind's backlog (``backlog.py --fairness``, issue 21).

A backlog of ``--jobs`` kie-lip-sync jobs (every upstream task already succeeded, each provider
answer delayed ``--latency`` seconds) is drained by the real ``dagster-daemon`` under a KIE read
budget that binds (``--reads`` per ``--window``), with the shipped run-queue limits (dagster.yaml).
``--late`` seconds after the daemon starts, ``--count`` kie-standard jobs turn stale one by one
(``--gap`` seconds apart). Reports, in one run: each late job's time from turning stale to
terminal (p50, max) against the target (sensor interval + 30 s), the backlog's drain time and its
read rate against the budget (and the most reads in any budget window), and verifies that every
job settled exactly once.

    .venv/bin/python benchmarks/backlog.py --fairness [--jobs 5000] [--late 60] [--count 20]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from harness import Seeded, compile_project, inflight, insert_jobs, log, shipped_run_queue, verify

from recon_dagster.core.kinds import get_kind
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
from recon_dagster_tests.support.daemon import daemon_process
from recon_dagster_tests.support.instance import dagster_home, drop_database, ensure_database
from recon_dagster_tests.support.sandbox_process import sandbox_process

ROOT = Path(__file__).resolve().parents[1]
BACKLOG_KIND = "kie-lip-sync"
LATE_KIND = "kie-standard"
SECOND_KIND = "kie-veo"
SLACK_S = 30


def seed(
    engine: sa.Engine, sandbox: Any, kind: str, count: int, stale_in: list[float], users: list[str]
) -> tuple[Seeded, list[float]]:
    """``count`` jobs of ``kind`` whose upstream task succeeded, job i turning stale ``stale_in[i]``
    seconds from now (negative: already stale); returns them and the unix time each turns stale."""
    ids: list[str] = []
    specs: list[tuple[str, dict[str, Any], str | None]] = []
    for _ in range(count):
        # The sandbox makes each task id in its provider's own shape (a fal id carries its app).
        specs.append((kind, {"outcome": "succeed", "polls_before_done": 0, "media_size": 1024}, None))
        ids.append(str(uuid.uuid4()))
    tasks: list[str | None] = list(sandbox.add_tasks(specs))
    threshold = get_kind(kind).stale_threshold.total_seconds()
    now = time.time()
    user_of = [users[i % len(users)] for i in range(count)]
    insert_jobs(engine, ids, user_of, [kind] * count, tasks, [threshold - s for s in stale_in])
    return Seeded(ids, sorted(set(user_of)), Counter({"completed": count})), [now + s for s in stale_in]


def terminal_at(engine: sa.Engine, ids: list[str]) -> dict[str, float]:
    """Unix time of each job's terminal reconcile outcome."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT job_id::text, extract(epoch FROM min(created_at)) FROM reconcile_events "
                "WHERE job_id = ANY(CAST(:ids AS uuid[])) AND outcome IN ('recovered', 'failed', 'swept', 'exhausted') "
                "GROUP BY job_id"
            ),
            {"ids": ids},
        ).all()
    return {j: float(t) for j, t in rows}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=5000, help=f"{BACKLOG_KIND} backlog")
    parser.add_argument(
        "--late", type=float, default=60.0, help="seconds from daemon start to the first late job"
    )
    parser.add_argument("--count", type=int, default=20, help=f"late {LATE_KIND} jobs")
    parser.add_argument("--gap", type=float, default=3.0, help="seconds between late jobs turning stale")
    parser.add_argument("--second", type=int, default=0, help=f"a second backlog of {SECOND_KIND} jobs")
    parser.add_argument("--reads", type=int, default=600, help="KIE read budget per window (binds)")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per provider answer")
    parser.add_argument("--sensor-interval", type=int, default=30, help="RECON_SENSOR_INTERVAL_S")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--timeout", type=float, default=3600)
    args = parser.parse_args(argv)
    if (
        args.second < 0
        or args.jobs < 1
        or args.count < 1
        or args.reads < 1
        or args.window <= 0
        or args.late < 0
        or args.gap < 0
    ):
        parser.error("--jobs, --count, --reads >= 1; --window > 0; --late, --gap, --second >= 0")

    server_url = (
        normalize_url(args.database_url) if args.database_url else resolve_database_url(allow_embedded=True)
    )
    name = f"recon_bench_{secrets.token_hex(4)}"
    ensure_database(server_url, name)
    url = with_database(server_url, name)
    os.environ[DATABASE_URL_ENV] = url
    media_dir = tempfile.mkdtemp(prefix="recon-bench-media-")
    problems: list[str] = []
    try:
        engine = get_engine(url)
        migrate(engine)
        compile_project()
        with sandbox_process(latency_s=args.latency) as sandbox, dagster_home(url) as home:
            queue = shipped_run_queue(home.dagster_yaml)
            print(
                f"database {redact(url)}; {args.jobs:,} {BACKLOG_KIND} jobs, then {args.count} {LATE_KIND} jobs "
                f"turning stale from {args.late:g} s, {args.gap:g} s apart; KIE reads {args.reads}/{args.window:g} s; "
                f"latency {args.latency * 1000:g} ms; sensor every {args.sensor_interval} s; run queue as shipped "
                f"({queue['max_concurrent_runs']} runs, {len(queue['tag_concurrency_limits'])} tag limits); "
                f"{os.cpu_count()} cores",
                flush=True,
            )
            users = [str(uuid.uuid4()) for _ in range(max(1, min(100, args.jobs // 20)))]
            backlog, _ = seed(engine, sandbox, BACKLOG_KIND, args.jobs, [-600.0] * args.jobs, users)
            log(f"  seeded {args.jobs:,} {BACKLOG_KIND} jobs")
            second = None
            if args.second:  # a second KIE backlog kind: together they fill every KIE batch run slot
                second, _ = seed(
                    engine, sandbox, SECOND_KIND, args.second, [-600.0] * args.second, [str(uuid.uuid4())]
                )
                log(f"  seeded {args.second:,} {SECOND_KIND} jobs")
            env = {
                **sandbox.env,
                DATABASE_URL_ENV: url,
                "RECON_MEDIA_DIR": media_dir,
                "RECON_SENSOR_INTERVAL_S": str(args.sensor_interval),
                "RECON_RECONCILE_CONCURRENCY": str(args.concurrency),
                "RECON_LIMITS": "database",
                "DAGSTER_GRPC_TIMEOUT_SECONDS": "300",
                "RECON_LIMIT_KIE": f"reads={args.reads}/{args.window:g},account=bench-kie-{secrets.token_hex(3)}",
            }
            # Seeded just before the daemon starts, turning stale relative to that moment.
            late_in = [args.late + i * args.gap for i in range(args.count)]
            late, stale_at = seed(engine, sandbox, LATE_KIND, args.count, late_in, [str(uuid.uuid4())])
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("ANALYZE jobs")
            started = time.time()
            backlogs = [b for b in (backlog, second) if b is not None]
            backlog_ids = [j for b in backlogs for j in b.job_ids]
            ids = backlog_ids + late.job_ids
            backlog_done = None
            with daemon_process(home, env) as daemon:
                last = 0.0
                while (left := inflight(engine, ids)) > 0:
                    if backlog_done is None and inflight(engine, backlog_ids) == 0:
                        backlog_done = time.time()
                    if not daemon.alive():
                        raise SystemExit(f"the daemon died:\n{daemon.log_tail()}")
                    if time.time() - started > args.timeout:
                        raise SystemExit(f"{left:,} jobs left after {args.timeout:g} s\n{daemon.log_tail()}")
                    if time.time() - last >= 15:
                        log(f"  {time.time() - started:6.1f} s: {len(ids) - left:,}/{len(ids):,} terminal")
                        last = time.time()
                    time.sleep(0.5)
                backlog_done = backlog_done or time.time()
            reads = sandbox.requests("kie", "read", window_s=args.window)
            done = terminal_at(engine, late.job_ids)
            waits = sorted(done[j] - s for j, s in zip(late.job_ids, stale_at, strict=True) if j in done)
            problems += [f"backlog: {p}" for b in backlogs for p in verify(engine, b)]
            problems += [f"late: {p}" for p in verify(engine, late)]
    finally:
        dispose_engines()
        drop_database(server_url, name)
        shutil.rmtree(media_dir, ignore_errors=True)

    drain_s = backlog_done - started
    stamps = reads["timestamps"]
    span = (max(stamps) - min(stamps)) if len(stamps) > 1 else float("nan")
    rate = reads["count"] / span * args.window if span == span and span > 0 else float("nan")
    bound = args.sensor_interval + SLACK_S
    p50, worst = statistics.median(waits), waits[-1]
    print(
        f"late {LATE_KIND} jobs: stale -> terminal p50 {p50:.1f} s, max {worst:.1f} s over {len(waits)} jobs "
        f"(target <= sensor interval + {SLACK_S} s = {bound} s: {'met' if worst <= bound else 'NOT met'}); "
        f"backlog: {len(backlog_ids):,} jobs ({BACKLOG_KIND} {args.jobs:,}, {SECOND_KIND} {args.second:,}) drained "
        f"in {drain_s:.1f} s from daemon start = {len(backlog_ids) / drain_s * 60:,.0f} jobs/min; KIE reads {reads['count']:,} at {rate:.0f} per {args.window:g} s "
        f"= {rate / args.reads:.2f} of the budget, most in any window {reads['max_in_window']} "
        f"(budget {args.reads}{', OVER' if reads['max_in_window'] > args.reads else ''})"
    )
    print(f"verification: {'OK, every job completed once, credits conserved' if not problems else 'FAILED'}")
    for p in problems:
        print(f"  - {p}")
    print(
        json.dumps(
            {
                "late_s": waits,
                "drain_s": drain_s,
                "reads": reads["count"],
                "max_in_window": reads["max_in_window"],
            }
        )
    )
    over = reads["max_in_window"] > args.reads
    return 0 if worst <= bound and not over and not problems else 1
