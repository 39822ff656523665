"""Database statements and transactions per reconciled job, counted at the driver (issue 21).

Seeds ``--jobs`` stale rows as ``backlog.py`` does (async kinds whose task succeeded, ~10% failed
upstream, ~5% sync kinds), works them in this process the way a reconcile run does (claim per
kind, poll, act: finalize / fail + refund / count; then the sweep), and counts every statement the
reconcile domain sends (SQLAlchemy ``before_cursor_execute``) and every transaction (``begin``),
plus the pool checkouts. Dagster's own storage is not in these figures: it has its own driver.

    .venv/bin/python benchmarks/statements.py [--jobs 400]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import random
import re
import secrets
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict

import sqlalchemy as sa
from harness import LIMIT_MODES, WATERMARK, inflight, seed, verify

from recon_dagster.db.engine import (
    DATABASE_URL_ENV,
    dispose_engines,
    get_engine,
    normalize_url,
    resolve_database_url,
    with_database,
)
from recon_dagster.db.migrate import migrate
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.batches import plan_batches
from recon_dagster.reconcile.reconciler import Reconciler, ReconcileSettings
from recon_dagster_tests.support.instance import drop_database, ensure_database
from recon_dagster_tests.support.sandbox_process import sandbox_process

_VERB = re.compile(
    r"^\s*(?:WITH\b.*?\)\s*)?(SELECT|UPDATE|INSERT|DELETE|SET|BEGIN|COMMIT|ROLLBACK)", re.S | re.I
)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--watermark", choices=sorted(WATERMARK), default="default", help="as backlog.py's")
    parser.add_argument("--media-bytes", type=int, default=16 * 1024, help="as backlog.py's (16 KiB)")
    parser.add_argument("--database-url", default=None)
    parser.add_argument(
        "--concurrency", type=int, default=16, help="jobs worked at once (threads), as a run's"
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="write a cProfile of the phases here (shares are exact with --concurrency 1)",
    )
    args = parser.parse_args(argv)
    server_url = (
        normalize_url(args.database_url) if args.database_url else resolve_database_url(allow_embedded=True)
    )
    name = f"recon_bench_{secrets.token_hex(4)}"
    ensure_database(server_url, name)
    url = with_database(server_url, name)
    os.environ[DATABASE_URL_ENV] = url
    os.environ.update(LIMIT_MODES["unbounded"])
    media_dir = tempfile.mkdtemp(prefix="recon-bench-media-")
    try:
        engine = get_engine(url)
        migrate(engine)
        with sandbox_process() as sandbox:
            os.environ.update(sandbox.env)
            seeded = seed(
                engine, sandbox, args.jobs, prefix="st", fail_share=0.10, sync_share=0.05,
                media_bytes=args.media_bytes, rng=random.Random(1), watermark=WATERMARK[args.watermark],
            )  # fmt: skip
            counts: Counter[str] = Counter()
            phases: dict[str, Counter[str]] = defaultdict(Counter)
            phase = ["setup"]
            texts: Counter[tuple[str, str]] = Counter()

            @sa.event.listens_for(engine, "before_cursor_execute")
            def _count(conn, cursor, statement, params, context, executemany):
                m = _VERB.match(statement)
                verb = m.group(1).upper() if m else "OTHER"
                counts[verb] += 1
                phases[phase[0]]["statements"] += 1
                texts[(phase[0], " ".join(statement.split())[:90])] += 1

            @sa.event.listens_for(engine, "begin")
            def _begin(conn):
                phases[phase[0]]["transactions"] += 1

            @sa.event.listens_for(engine.pool, "checkout")
            def _checkout(*_a):
                phases[phase[0]]["checkouts"] += 1

            rec = Reconciler(
                engine,
                providers_from_env(),
                LocalMediaStore(base_dir=media_dir),
                run_id="statements",
                settings=ReconcileSettings(concurrency=args.concurrency),
            )
            profiler = cProfile.Profile(time.process_time) if args.profile else None  # CPU, not wall
            from recon_dagster.db import jobs as jobs_db

            with engine.connect() as conn:
                rows = jobs_db.scan_stale(conn, args.jobs * 2)
            cpu: Counter[str] = Counter()

            def timed(name: str, fn, *a):
                phase[0] = name
                t0 = time.process_time()
                if profiler is not None:
                    profiler.enable()
                try:
                    return fn(*a)
                finally:
                    if profiler is not None:
                        profiler.disable()
                    cpu[name] += time.process_time() - t0

            for batch in plan_batches(rows, batch_size=500, single_below=1):
                work, _ = timed("claim", rec.claim, list(batch.claims), batch.run_key)
                polled = timed("poll", rec.poll, work)
                timed("act", rec.act, polled, batch.run_key)
            timed("sweep", lambda: rec.sweep_stale("sweep:statements", limit=args.jobs))
            phase[0] = "done"
            if profiler is not None:
                profiler.dump_stats(args.profile)
            left = inflight(engine, seeded.job_ids)
            problems = verify(engine, seeded)
        n = args.jobs
        total = sum(p["statements"] for k, p in phases.items() if k not in ("setup", "done"))
        txs = sum(p["transactions"] for k, p in phases.items() if k not in ("setup", "done"))
        outs = sum(p["checkouts"] for k, p in phases.items() if k not in ("setup", "done"))
        print(
            f"{n} jobs: {total / n:.2f} statements, {txs / n:.2f} transactions, {outs / n:.2f} pool checkouts per job "
            f"(left in flight {left})"
        )
        print(f"  CPU of this process (all threads): {sum(cpu.values()) / n * 1000:.2f} ms/job")
        for k in ("claim", "poll", "act", "sweep"):
            p = phases[k]
            print(
                f"  {k:6s} {p['statements'] / n:6.2f} statements/job, {p['transactions'] / n:5.2f} transactions/job, "
                f"{cpu[k] / n * 1000:6.2f} ms CPU/job"
            )
        print("  by verb: " + ", ".join(f"{v} {c / n:.2f}" for v, c in counts.most_common()))
        print("  most frequent statements (per job):")
        for (k, text), c in texts.most_common(14):
            if k in ("claim", "poll", "act", "sweep"):
                print(f"    {c / n:5.2f} {k:5s} {text}")
        print(f"verification: {problems if problems else 'OK'}")
        return 0 if not problems and not left else 1
    finally:
        dispose_engines()
        drop_database(server_url, name)
        shutil.rmtree(media_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    raise SystemExit(main(sys.argv[1:]))
