"""Time the orphan sweep: 10,000 upstream tasks listed against 100,000 create-ledger rows.

Runs in a throwaway database on the configured server (RECON_DATABASE_URL) or the embedded one,
dropped at the end, and the loopback sandbox (no added latency). The sandbox holds 10,000
Replicate predictions created over the last 5 hours: 9,500 recorded in the ledger (one in ten of
them for a job that ended without naming it: an orphan, running or succeeded; the rest named by
their completed job) and 500 no ledger row knows (another system's). The ledger holds 100,000
creates over the last 5 hours, one per job. Prints, for a dry run and for an acting run, the
sweep's wall time, the provider requests it used and what it found.

    .venv/bin/python benchmarks/orphans.py [--tasks 10000] [--ledger 100000]
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from datetime import timedelta

import sqlalchemy as sa

from recon_dagster.db.engine import dispose_engines, get_engine, redact, resolve_database_url, with_database
from recon_dagster.db.migrate import migrate
from recon_dagster.operator.orphans import dry_run_providers
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.orphan_sweep import SweepPolicy, sweep_orphans
from recon_dagster.sandbox import SandboxServer, Scenario

UNKNOWN_SHARE = 20  # one listed task in 20 is no create of ours
WINDOW_S = 5 * 3600


def fill_ledger(engine: sa.Engine, rows: int) -> None:
    """``rows`` jobs and their one create each; job g's task is ``bench-g``. Every tenth job ended
    without naming its task (its task is an orphan); the others completed naming it."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                """
                INSERT INTO jobs (id, user_id, job_type, status, provider_kind, provider_task_id,
                                  provider_call_started_at, created_at)
                SELECT CAST(md5('job' || g) AS uuid), CAST(md5('user') AS uuid), 'image',
                       CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'completed' END, 'replicate-prediction',
                       CASE WHEN g % 10 = 0 THEN NULL ELSE 'bench-' || g END,
                       now() - make_interval(secs => g % :w), now() - make_interval(secs => g % :w)
                FROM generate_series(1, :n) g
                """
            ),
            {"n": rows, "w": WINDOW_S},
        )
        conn.execute(
            sa.text(
                """
                INSERT INTO upstream_creates (id, job_id, seq, provider, provider_kind, marker, marker_sent,
                  fingerprint, intent_at, state, state_at, task_id, task_recorded_at)
                SELECT CAST(md5('create' || g) AS uuid), CAST(md5('job' || g) AS uuid), 1, 'replicate',
                       'replicate-prediction', CAST(md5('job' || g) AS uuid) || '.1', true, md5('fp' || g),
                       now() - make_interval(secs => g % :w), 'created', now(), 'bench-' || g, now()
                FROM generate_series(1, :n) g
                """
            ),
            {"n": rows, "w": WINDOW_S},
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE jobs")
        conn.exec_driver_sql("VACUUM ANALYZE upstream_creates")


def seed_tasks(sb: SandboxServer, count: int) -> None:
    state, now = sb.sandbox.state, time.time()
    for g in range(1, count + 1):
        unknown = g % UNKNOWN_SHARE == 0
        scenario = Scenario(outcome="run_forever") if g % 3 == 0 else Scenario(polls_before_done=0)
        state.add_task(
            "replicate-prediction", scenario, f"other-{g}" if unknown else f"bench-{g}",
            created_at=now - (g % WINDOW_S), input={"prompt": f"p{g}"},
        )  # fmt: skip


def run(engine: sa.Engine, sb: SandboxServer, providers: object, act: bool) -> None:
    before = sb.stats()["requests_total"]
    policy = SweepPolicy(
        window=timedelta(seconds=WINDOW_S + 600), grace=timedelta(0), act=act, shadowed=lambda kind: False
    )
    start = time.perf_counter()
    report = sweep_orphans(engine, providers, policy)
    took = time.perf_counter() - start
    used = sb.stats()["requests_total"] - before
    counts = ", ".join(f"{a} {n}" for a, n in sorted(report.counts().items()))
    label = "acting " if act else "dry run"
    print(f"{label}: {took:6.2f} s, {used} provider requests; listed {dict(report.listed)}; {counts}")
    if report.errors:
        print(f"  errors: {report.errors}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--ledger", type=int, default=100_000)
    args = parser.parse_args()
    server_url = resolve_database_url(allow_embedded=True)
    name = f"recon_bench_{secrets.token_hex(4)}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = with_database(server_url, name)
    try:
        engine = get_engine(url)
        migrate(engine)
        start = time.perf_counter()
        fill_ledger(engine, args.ledger)
        print(
            f"database: {redact(url)}; {args.ledger:,} jobs and ledger rows in {time.perf_counter() - start:.1f} s"
        )
        with SandboxServer(api_key="bench-key") as sb:
            seed_tasks(sb, args.tasks)
            os.environ.update(sb.env())
            print(f"sandbox: {args.tasks:,} Replicate predictions ({args.tasks // UNKNOWN_SHARE} not ours)")
            providers = providers_from_env()
            run(engine, sb, dry_run_providers(providers), act=False)
            run(engine, sb, dry_run_providers(providers), act=True)
            run(engine, sb, dry_run_providers(providers), act=True)  # again: everything judged
            providers.close()
    finally:
        dispose_engines()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
