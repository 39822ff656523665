"""The spend and orphan schedules beside a backlog drain: do all of recon_dagster's connections
to the app's database stay within ``RECON_DB_MAX_CONNECTIONS``, and are KIE's balance samples
each measured from once?

A real ``dagster-daemon`` on a temporary DAGSTER_HOME with the shipped run queue (dagster.yaml:
13 runs at once, the provider tag limits), the provider sandbox in its own process, a fresh
PostgreSQL database. ``--jobs`` stale rows are drained by the reconcile sensor while the code
location's extra sensor (``benchmarks/spend_location.py``) plays a tick of the spend schedule
(yesterday at every provider: a run of spend_reconciliation_job) and one of the orphan schedule
every ``--interval`` seconds, ``--ticks`` times: spend runs overlap each other and the drain.

Prints the peak connections to the app's database (this benchmark's own left out; sampled every
0.25 s from pg_stat_activity) against the budget, the most runs of each job started at once, the
runs of each job and how they ended, the KIE samples (each must start at a sample no other
starts at) and the drain's verification (nothing settled twice).

    .venv/bin/python benchmarks/spend_beside_backlog.py [--jobs 2000] [--ticks 6] [--interval 15]
        [--budget 30] [--latency 0.05] [--database-url URL]
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import sys
import tempfile
import time
from collections import Counter

import sqlalchemy as sa
from harness import LIMIT_MODES, compile_project, inflight, log, seed, shipped_run_queue, verify

from recon_dagster import config
from recon_dagster.db import balance_samples
from recon_dagster.db.budget import check_run_queue
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

HERE = os.path.dirname(os.path.abspath(__file__))
ME = "recon-spend-benchmark"  # this benchmark's own connections: not counted against the budget
JOBS = ("reconcile_job", "spend_reconciliation_job", "orphan_sweep_job")


def app_connections(engine: sa.Engine, app_db: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = :db AND application_name <> :me"
                ),
                {"db": app_db, "me": ME},
            ).scalar_one()
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--ticks", type=int, default=6, help="spend + orphan schedule ticks played")
    parser.add_argument("--interval", type=int, default=15, help="seconds between the played ticks")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per sandbox answer")
    parser.add_argument(
        "--budget", type=int, default=int(config.SETTINGS["RECON_DB_MAX_CONNECTIONS"].default)
    )
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    server_url = (
        normalize_url(args.database_url) if args.database_url else resolve_database_url(allow_embedded=True)
    )
    name = f"recon_bench_{secrets.token_hex(4)}"
    ensure_database(server_url, name)
    url = with_database(server_url, name)
    os.environ[DATABASE_URL_ENV] = url
    media_dir = tempfile.mkdtemp(prefix="recon-bench-media-")
    peak, started_at_once, runs_by_job, problems = 0, Counter[str](), Counter[tuple[str, str]](), []
    samples: list[sa.Row] = []
    try:
        engine = get_engine(
            sa.make_url(url).update_query_dict({"application_name": ME}).render_as_string(False)
        )
        migrate(engine)
        compile_project()
        with (
            sandbox_process(latency_s=args.latency) as sandbox,
            dagster_home(url, module="spend_location", location="recon_dagster") as home,
        ):
            queue = shipped_run_queue(home.dagster_yaml)
            problem = check_run_queue(queue["max_concurrent_runs"], args.budget)
            if problem:
                parser.error(problem)
            print(
                f"database {redact(url)}; {args.jobs:,} stale jobs, {args.ticks} spend + orphan ticks every "
                f"{args.interval} s, shipped run queue ({queue['max_concurrent_runs']} runs at once), "
                f"budget {args.budget} (RECON_DB_MAX_CONNECTIONS), {os.cpu_count()} cores",
                flush=True,
            )
            env = {
                **sandbox.env,
                **LIMIT_MODES["unbounded"],
                DATABASE_URL_ENV: url,
                "RECON_DB_MAX_CONNECTIONS": str(args.budget),
                "RECON_MEDIA_DIR": media_dir,
                "PYTHONPATH": os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])),
                "SPEND_BENCH_TICKS": str(args.ticks),
                "SPEND_BENCH_INTERVAL_S": str(args.interval),
            }
            seeded = seed(
                engine, sandbox, args.jobs, prefix="sp", fail_share=0.1, sync_share=0.05,
                media_bytes=4096, rng=random.Random(args.seed),
            )  # fmt: skip
            started = time.monotonic()
            with daemon_process(home, env) as daemon, home.instance() as inst:
                from dagster import DagsterRunStatus, RunsFilter

                drained_at = None
                while True:
                    peak = max(peak, app_connections(engine, name))
                    running = inst.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
                    for job, n in Counter(r.job_name for r in running).items():
                        started_at_once[job] = max(started_at_once[job], n)
                    if drained_at is None and inflight(engine, seeded.job_ids) == 0:
                        drained_at = time.monotonic() - started
                        log(f"  backlog drained after {drained_at:.1f} s")
                    spend_runs = [r for r in inst.get_runs(RunsFilter(job_name="spend_reconciliation_job"))]
                    everything_ran = len(spend_runs) >= args.ticks and all(
                        r.is_finished for r in inst.get_runs()
                    )
                    if drained_at is not None and everything_ran:
                        break
                    if not daemon.alive():
                        raise SystemExit(f"the daemon died:\n{daemon.log_tail()}")
                    if time.monotonic() - started > args.timeout:
                        # The figures so far are still the figures: a run the code server was too
                        # slow to launch (a loaded machine) fails, its jobs wait out their lease.
                        problems.append(f"not done after {args.timeout:g} s")
                        break
                    time.sleep(0.25)
                for run in inst.get_runs():
                    runs_by_job[(run.job_name, run.status.value)] += 1
            problems += verify(engine, seeded)
            with engine.connect() as conn:
                samples = list(
                    conn.execute(
                        sa.text(
                            f"SELECT id, previous_id FROM {balance_samples.TABLE} WHERE provider = 'kie' ORDER BY id"
                        )
                    )
                )
    finally:
        dispose_engines()
        drop_database(server_url, name)
        import shutil

        shutil.rmtree(media_dir, ignore_errors=True)

    chain_ok = [s.previous_id for s in samples] == [None, *(s.id for s in samples[:-1])]
    if not chain_ok:
        problems.append(f"KIE samples are not one chain: {[tuple(s) for s in samples]}")
    print(
        f"connections: peak {peak} to the app's database against a budget of {args.budget} "
        f"({'within' if peak <= args.budget else 'OVER'} it)"
    )
    print("most runs started at once: " + ", ".join(f"{j} {started_at_once[j]}" for j in JOBS))
    print("runs: " + ", ".join(f"{j} {s.lower()} {n}" for (j, s), n in sorted(runs_by_job.items())))
    print(
        f"backlog: {args.jobs:,} jobs drained in {drained_at:.1f} s" if drained_at else "backlog: not drained"
    )
    print(
        f"KIE balance samples: {len(samples)}, {'one chain, each measured from once' if chain_ok else 'BROKEN'}"
    )
    print(f"verification: {'OK' if not problems else 'FAILED'}")
    for p in problems:
        print(f"  - {p}")
    return 0 if peak <= args.budget and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
