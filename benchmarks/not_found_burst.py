"""A burst of not-found answers from one provider, polled by several processes at once: how many
jobs does the not-found breaker let fail, and what does recording every answer cost?

Runs in a throwaway database on the configured server (RECON_DATABASE_URL) or the embedded one,
dropped at the end, against the loopback sandbox. ``--jobs`` stale replicate-prediction jobs whose
task ids the sandbox never issued (what a wrong token, account or base path looks like), split over
``--processes`` separate Python processes, each working its share with ``--threads`` threads and its
own engine, all released at once. Prints failed / counted-attempt jobs, the bound
(RECON_NOT_FOUND_BURST), and the per-answer cost of the record + count.

    .venv/bin/python benchmarks/not_found_burst.py [--jobs 500] [--processes 4] [--threads 16]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from datetime import timedelta

import sqlalchemy as sa

from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.engine import dispose_engines, get_engine, redact, resolve_database_url, with_database
from recon_dagster.db.migrate import migrate
from recon_dagster.defs.settings_check import breaker_policy
from recon_dagster.sandbox import SandboxServer
from recon_dagster_tests.support.answers import stale_job
from recon_dagster_tests.support.instance import drop_database, ensure_database

_WORKER = """
import json, sys, time
from recon_dagster.db.engine import get_engine
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.defs.settings_check import breaker_policy
from recon_dagster.reconcile.breaker import NotFoundBreaker
from recon_dagster.reconcile.reconciler import ReconcileSettings, Reconciler

jobs, owner, threads = json.loads(sys.argv[1])
rec = Reconciler(get_engine(), providers_from_env(), LocalMediaStore(base_dir="/tmp/nf-burst-media"),
                 settings=ReconcileSettings(concurrency=threads),
                 breaker=NotFoundBreaker(get_engine(), breaker_policy()))
print("ready", flush=True)
sys.stdin.readline()
start = time.perf_counter()
outcomes = rec.reconcile_many(jobs, owner)
print(json.dumps({"outcomes": [o.outcome.value for o in outcomes], "s": time.perf_counter() - start}), flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    server_url = resolve_database_url(allow_embedded=True)
    name = f"recon_bench_{secrets.token_hex(4)}"
    ensure_database(server_url, name)
    url = with_database(server_url, name)
    policy = breaker_policy()
    print(f"database: {redact(url)}; {args.jobs} jobs, {args.processes} processes x {args.threads} threads")
    print(
        f"breaker: more than {policy.burst} not-found, > {policy.share:.0%} of answers, {policy.window_s:g}s"
    )
    try:
        engine = get_engine(url)
        migrate(engine)
        with SandboxServer() as sandbox:
            env = {**os.environ, **sandbox.env(), "RECON_DATABASE_URL": url}
            for round_ in range(args.rounds):
                with engine.begin() as conn:
                    conn.execute(sa.text("TRUNCATE provider_poll_answers"))
                jobs = [stale_job(engine, "replicate-prediction", "image")[1] for _ in range(args.jobs)]
                procs = []
                for p in range(args.processes):
                    share = jobs[p :: args.processes]
                    owner = f"bench-{round_}-{p}"
                    with engine.begin() as conn:
                        claims = [jobs_db.Claim(j, 0) for j in share]
                        jobs_db.claim_jobs(conn, claims, owner, timedelta(minutes=10))
                    payload = json.dumps([[str(j) for j in share], owner, args.threads])
                    proc = subprocess.Popen(
                        [sys.executable, "-c", _WORKER, payload],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                    )  # fmt: skip
                    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
                    procs.append(proc)
                for proc in procs:
                    assert proc.stdin is not None
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
                outcomes: list[str] = []
                slowest = 0.0
                for proc in procs:
                    out, _ = proc.communicate(timeout=600)
                    result = json.loads(out.strip().splitlines()[-1])
                    outcomes += result["outcomes"]
                    slowest = max(slowest, result["s"])
                failed = outcomes.count("failed")
                with engine.connect() as conn:
                    answers = conn.execute(sa.text("SELECT count(*) FROM provider_poll_answers")).scalar_one()
                print(
                    f"round {round_ + 1}: failed+refunded {failed} (bound {policy.burst}), attempt counted "
                    f"{outcomes.count('error')}, other {len(outcomes) - failed - outcomes.count('error')}; "
                    f"answers recorded {answers}; {len(outcomes) / slowest:.0f} jobs/s ({slowest:.2f} s)"
                )
                with engine.begin() as conn:
                    conn.execute(sa.text("DELETE FROM usage_logs; DELETE FROM jobs"))
            # What recording and counting costs one not-found answer, on a window holding a full burst.
            from recon_dagster.reconcile.breaker import record_answer, window_counts

            n = 200
            start = time.perf_counter()
            for _ in range(n):
                with engine.begin() as conn:
                    record_answer(
                        conn,
                        "replicate",
                        not_found=True,
                        window_s=policy.window_s,
                        kind="replicate-prediction",
                    )
                with engine.connect() as conn:
                    window_counts(conn, policy.window_s, "replicate")
            per = (time.perf_counter() - start) / n * 1000
            print(f"record + count of one not-found answer: {per:.2f} ms (window of {answers + n} rows)")
    finally:
        dispose_engines()
        drop_database(server_url, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
