"""A year beside the app, compressed: how big our side gets, with and without retention, and what a
pruning pass costs the app's writes.

Two parts:

``year``: two worlds, one pruned (``prune_history``'s three parts: our tables' pass, the job_story
pages, our Dagster runs) and one never pruned, each its own app database and its own Dagster
instance on PostgreSQL, given twelve months of traffic: ``--per-day`` generations a day (the issue's
mid-size app is 50,000; the default here is 1,000, a 1/50 scale, because the machine is shared),
one ``usage_logs`` row and one create-ledger row per generation, 2% stuck, and four KIE balance
samples a day (the spend run's chain, ``recon_balance_samples``). Most days are
bulk-seeded (each stuck job with 3 reconcile attempts); ``--sampled-days`` days spread over the
year run their stuck jobs through the real reconciler instead (``year_world.py``: the sensor and
reconcile runs in-process, as ``reconcile --once`` and the tests run them, against the loopback
sandbox, with an outage on every other sampled day and a 429 with Retry-After now and then; the
pruned world's retention pass after every tick, on a compressed clock). Dagster's run history
is bulk-seeded too: a sampled day without an outage is the template, and every bulk day gets a
clone of its runs and their event log, made with SQL in dagster-postgres's tables and re-dated
(``year_runs.py``), so the never-pruned instance holds a year's runs and the pruned one what run
retention (``prune_runs``, through the instance API) leaves. The pruned world also runs a pass at
each month's end. At months 1, 6 and 12 it prints each of our tables' and their
indexes' sizes, Dagster's storage (runs, event log, partitions), the stale scan's and
``explain``'s latency (median of 20), the UI's GraphQL asset and run pages and runs list (median
of 5, in-process through dagster-graphql's schema), the month-end pass and its run-retention part.

``lock``: ``--lock-events`` rows of ``reconcile_events`` past their retention (10,000,000 in the
issue; 2,000,000 by default here), then the app's writers (INSERT and UPDATE ``jobs``, INSERT
``reconcile_events``, autocommit, as ``benchmarks/migrate_live.py`` runs them) measured for a few
seconds, then a pruning pass of ``--pass-s`` seconds while they run: their p50 / p99 / max latency
before and during, how many of their statements waited on a lock (``pg_stat_activity`` sampled
every 20 ms), and the pass's slowest batch.

    RECON_DATABASE_URL=postgresql://root@127.0.0.1:5432/postgres \\
      .venv/bin/python benchmarks/year.py [--part year|lock|both] [--per-day 1000] [--sampled-days 3]
        [--lock-events 2000000]
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # recon_dagster_tests (not installed)

from recon_dagster.db.engine import (
    dispose_engines,
    get_engine,
    libpq_url,
    normalize_url,
    resolve_database_url,
    with_database,
)
from recon_dagster.db.jobs import scan_stale
from recon_dagster.db.migrate import migrate
from recon_dagster.db.retention import Horizons, cutoffs, prune_pass
from recon_dagster.operator.explain import load_story
from recon_dagster.sandbox import SandboxServer
from recon_dagster_tests.support.instance import drop_database, ensure_database

sys.path.insert(0, str(Path(__file__).resolve().parent))  # year_world, harness (run from anywhere)
from year_runs import check_clone, check_deleted, clone_ids, events_of, template_ids
from year_world import World

DAY = 86_400.0
TABLES = (
    "jobs",
    "usage_logs",
    "reconcile_events",
    "upstream_creates",
    "recon_pruned_jobs",
    "reconcile_decisions",
    "recon_balance_samples",
)
HORIZONS = Horizons(
    events_s=90 * DAY, decisions_s=30 * DAY, creates_s=90 * DAY, tombstones_s=400 * DAY,
    poll_answers_s=600, orphan_window_s=6 * 3600, spend_final_after_s=DAY,
)  # fmt: skip

# One simulated day of history, :day days before now: jobs, their usage and creates, and for 2%
# (every 50th) three reconcile attempts (not on a sampled day: its stuck jobs are reconciled for
# real, year_world.py). Kinds in rough registry proportions.
SEED_DAY = """
WITH j AS (
  INSERT INTO jobs (user_id, job_type, status, provider_kind, provider_task_id, provider_call_started_at,
                    created_at, completed_at, updated_at)
  SELECT md5(CAST(:day AS text) || '/' || g)::uuid,
         (ARRAY['image','image','image','video','audio','text'])[1 + g % 6],
         CASE WHEN g % 50 = 0 AND g % 100 = 0 THEN 'failed' ELSE 'completed' END,
         (ARRAY['kie-standard','kie-standard','fal-image','kie-veo','elevenlabs-async','replicate-prediction'])[1 + g % 6],
         'task-' || CAST(:day AS text) || '-' || g,
         now() - make_interval(days => :day) + make_interval(secs => g * 86400.0 / :n),
         now() - make_interval(days => :day) + make_interval(secs => g * 86400.0 / :n),
         now() - make_interval(days => :day) + make_interval(secs => g * 86400.0 / :n + 60),
         now() - make_interval(days => :day)
  FROM generate_series(1, :n) AS g
  RETURNING id, status, provider_kind, provider_task_id, created_at
), u AS (
  INSERT INTO usage_logs (user_id, job_id, amount, status, created_at)
  SELECT md5(id::text)::uuid, id, 10, CASE WHEN status = 'completed' THEN 'committed' ELSE 'refunded' END, created_at FROM j
  RETURNING job_id
), c AS (
  INSERT INTO upstream_creates (id, job_id, seq, provider, provider_kind, marker, fingerprint, state, task_id, fate, intent_at)
  SELECT md5('c' || id::text)::uuid, id, 1, split_part(provider_kind, '-', 1), provider_kind, id::text || '.1', 'f',
         'created', provider_task_id, 'attached', created_at FROM j
  RETURNING job_id
), e AS (
  INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome, detail, run_key, run_id, cause, created_at)
  SELECT id, provider_kind, a, CASE WHEN a < 3 THEN 'still_running' WHEN status = 'completed' THEN 'recovered' ELSE 'failed' END,
         'upstream said running', id::text || ':' || a, md5(id::text || a)::uuid::text, 'answered',
         created_at + make_interval(mins => 10 + 5 * a)
  FROM j, generate_series(1, 3) AS a
  WHERE :bulk AND ('x' || substr(md5(id::text), 1, 8))::bit(32)::int % 50 = 0
  RETURNING 1
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM c), (SELECT count(*) FROM e)
"""


# The KIE spend run's balance samples, a chain, 4 a day (:day days before now, at :h hours).
SAMPLE = (
    "INSERT INTO recon_balance_samples (provider, balance, sampled_at, previous_id) "
    "SELECT 'kie', 1000, now() - make_interval(days => :day) + make_interval(hours => :h), "
    "(SELECT max(id) FROM recon_balance_samples WHERE provider = 'kie')"
)

STALE_ROWS = (
    "INSERT INTO jobs (user_id, job_type, status, provider_kind, provider_task_id, provider_call_started_at) "
    "SELECT gen_random_uuid(), 'image', 'processing', 'kie-standard', 'stuck-' || g, now() - interval '1 hour' "
    "FROM generate_series(1, 200) g RETURNING id"
)


def sizes(conn: sa.Connection) -> str:
    parts = []
    for t in TABLES:
        rows, table, idx = conn.execute(
            sa.text(f"SELECT (SELECT count(*) FROM {t}), pg_table_size('{t}'), pg_indexes_size('{t}')")
        ).one()
        parts.append(f"{t} {rows:,} rows {table / 2**20:.1f}+{idx / 2**20:.1f} MiB")
    return "; ".join(parts)


OURS = (
    "reconcile_events",
    "upstream_creates",
    "recon_pruned_jobs",
    "reconcile_decisions",
    "recon_balance_samples",
)


def index_sizes(conn: sa.Connection) -> str:
    """Each index of our tables, its size."""
    rows = conn.execute(
        sa.text(
            "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes "
            "WHERE relname = ANY(:t) ORDER BY relname, indexrelname"
        ),
        {"t": list(OURS)},
    )
    return ", ".join(f"{name} {size / 1024:,.0f}" for name, size in rows) + " KiB"


def median_ms(fn, times: int = 20) -> float:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(times):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)


def _measure(world: World, month: int, seeded: float, report: str) -> None:
    """The month's figures for one world: sizes, the stale scan (over a constant 200 stale rows,
    added for the measurement only: the real reconciler would work them), explain, Dagster's
    storage and its UI's GraphQL pages."""
    engine = world.engine
    with engine.begin() as conn:
        stale = conn.execute(sa.text(STALE_ROWS)).scalars().all()
    with engine.connect() as conn:
        some = conn.execute(
            sa.text("SELECT job_id FROM reconcile_events ORDER BY created_at DESC LIMIT 1")
        ).scalar()
        scan = median_ms(lambda c=conn: scan_stale(c))  # type: ignore[misc]
        table = sizes(conn)
        indexes = index_sizes(conn)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM jobs WHERE id = ANY(:ids)"), {"ids": list(stale)})
    explain = median_ms(lambda e=engine, j=some: load_story(e, j))  # type: ignore[misc]
    gql = world.graphql_ms()
    runs_pass = (
        "month-end run-retention pass {:.1f} s, {:,} runs deleted".format(*world.runs_pruned[-1])
        if world.mode == "pruned" and world.runs_pruned
        else "no run retention"
    )
    print(f"month {month:2d} {world.mode:6s}: {table}")
    print(f"           indexes: {indexes}")
    print(f"           dagster: {world.dagster_sizes()}; {world.partitions():,} job_story partitions")
    print(f"           dagster: {runs_pass}; run page of {world.run_page}", flush=True)
    print(
        f"           stale scan {scan:.1f} ms, explain {explain:.1f} ms, seeded in {seeded:.1f} s; graphql "
        + ", ".join(f"{k} {v:.0f} ms" for k, v in gql.items())
        + report,
        flush=True,
    )


def verify_clone(world: World) -> str:
    """The first bulk day's clone of the template's first run is a run to Dagster."""
    if world.template is None or not world.cloned:
        return "no clone to verify"
    original = template_ids(world.dagster_engine)[0]
    mine = clone_ids([original], world.cloned[0][0])[0]
    return check_clone(world.instance, world.dagster_engine, mine, original)


def checked(check) -> str:  # type: ignore[no-untyped-def]
    """A check's line, or why it failed (the year goes on: its figures are still worth having)."""
    try:
        return str(check())
    except RuntimeError as exc:
        return f"CHECK FAILED: {exc}"


def pick_doomed(world: World, sim_now: datetime) -> tuple[str, tuple[int, int]] | None:
    """A clone the coming pass must delete: a successful run without a ``recon/outcome`` tag, of
    the oldest bulk day more than 31 days before ``sim_now`` still stored. (its id, its event rows
    and asset event tags)"""
    if world.template is None:
        return None
    with world.dagster_engine.connect() as conn:
        plain = conn.execute(
            sa.text(
                "SELECT run_id FROM bench.runs r WHERE status = 'SUCCESS' AND NOT EXISTS "
                "(SELECT 1 FROM bench.run_tags t WHERE t.run_id = r.run_id AND t.key = 'recon/outcome') "
                "ORDER BY id LIMIT 1"
            )
        ).scalar()
    if plain is None:
        return None
    for day, _ in world.cloned:
        if day < sim_now - timedelta(days=31):
            run_id = clone_ids([plain], day)[0]
            if world.instance.get_run_by_id(run_id) is not None:
                return run_id, events_of(world.dagster_engine, run_id)
    return None


def year(server: str, per_day: int, sampled: int) -> None:
    """Twelve simulated months in two worlds; ``sampled`` days spread over the year run through
    the real reconciler (see year_world.py), the rest bulk-seeded."""
    media_dir = tempfile.mkdtemp(prefix="recon-bench-year-")
    rng = random.Random(54)
    # Days before the end of the sampled days, spread from the year's third week to its last
    # fortnight (months 1 and 12 each have one: their runs are still within run retention).
    sample_days = {round(345 - k * 330 / max(sampled - 1, 1)) for k in range(sampled)}
    zero = datetime.now(UTC)
    worlds: list[World] = []
    saved = dict(os.environ)
    try:
        with SandboxServer(api_key="bench-year-key") as sandbox:
            os.environ.update(sandbox.env())
            for mode in ("pruned", "kept"):
                worlds.append(World(server, mode, media_dir, HORIZONS))
            print(
                f"year: {per_day:,} generations a day (1/{50_000 // per_day} of 50,000), 2% stuck; "
                f"{len(sample_days)} sampled days (days {sorted(sample_days, reverse=True)} before the end) of "
                f"{per_day // 50} stuck jobs each through the real reconciler, the rest bulk-seeded",
                flush=True,
            )
            for month in range(1, 13):
                days = range(360 - 30 * (month - 1), 360 - 30 * month, -1)
                for world in worlds:
                    t0 = time.monotonic()
                    with world.engine.begin() as conn:
                        for day in days:
                            conn.execute(
                                sa.text(SEED_DAY), {"day": day, "n": per_day, "bulk": day not in sample_days}
                            )
                            for h in (0, 6, 12, 18):
                                conn.execute(sa.text(SAMPLE), {"day": day, "h": h})
                    seeded = time.monotonic() - t0
                    t1, cloned = time.monotonic(), len(world.cloned)
                    for day in days:  # in simulated order: a sampled day, or a bulk day's runs
                        sim_day = zero - timedelta(days=day)
                        if day not in sample_days:
                            world.bulk_runs(sim_day)
                            continue
                        outage = day in sorted(sample_days)[1::2]  # every other one, not the first
                        r = world.sampled_day(sandbox, sim_day, per_day // 50, rng, outage=outage)
                        print(
                            f"  sampled day {sim_day:%Y-%m-%d} (month {month}) {world.mode}"
                            f"{' with an outage' if outage else ''}: {r.line()}",
                            flush=True,
                        )
                    if world.template and len(world.cloned) > cloned:
                        print(
                            f"  month {month} {world.mode}: {len(world.cloned) - cloned} bulk days' runs cloned "
                            f"(template: {world.template.runs} runs, {world.template.events:,} events) in "
                            f"{sum(s for _, s in world.cloned[cloned:]):.1f} s, month {time.monotonic() - t1:.1f} s",
                            flush=True,
                        )
                    if month == 1:
                        print(f"  {world.mode}: {checked(lambda w=world: verify_clone(w))}", flush=True)
                    report = ""
                    sim_now = zero - timedelta(days=360 - 30 * month)
                    doomed = pick_doomed(world, sim_now) if world.mode == "pruned" else None
                    if world.mode == "pruned" and month in (1, 6, 12):
                        report = watched_pass(world, sim_now)
                    elif world.mode == "pruned":
                        world.retention(sim_now)
                    if doomed:
                        print(
                            f"  {world.mode}: "
                            + checked(
                                lambda w=world, d=doomed: check_deleted(w.instance, w.dagster_engine, *d)
                            ),
                            flush=True,
                        )
                    # What autovacuum does between passes (both databases): dead rows' space is
                    # reused, not returned.
                    for url in (world.url, world.dagster_url):
                        with psycopg.connect(libpq_url(url), autocommit=True) as pg:
                            pg.execute("VACUUM ANALYZE")
                    if month in (1, 6, 12):
                        _measure(world, month, seeded, report)
    finally:
        for world in worlds:
            world.close()
        os.environ.clear()
        os.environ.update(saved)
        dispose_engines()
        for world in worlds:
            for name in world.names:
                drop_database(server, name)
        shutil.rmtree(media_dir, ignore_errors=True)


class AppWriters:
    """The app's writers and the reconciler's event writes, each latency kept with its start."""

    def __init__(self, url: str, threads: int, inflight: list[str]) -> None:
        self.url, self.inflight = url, inflight
        self.samples: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(threads)]
        for t in self.threads:
            t.start()

    def _loop(self, n: int) -> None:
        statements = (
            ("INSERT INTO jobs (user_id, job_type, status) VALUES (%s, 'image', 'pending')", lambda i: [uuid.uuid4()]),
            ("UPDATE jobs SET progress = progress, updated_at = now() WHERE id = %s",
             lambda i: [self.inflight[(i * 7919 + n) % len(self.inflight)]]),
            ("INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome) VALUES (%s, 'kie-standard', 1, 'still_running')",
             lambda i: [self.inflight[(i * 31 + n) % len(self.inflight)]]),
        )  # fmt: skip
        with psycopg.connect(self.url, autocommit=True, application_name="app-worker") as conn:
            conn.execute("SET statement_timeout = '60s'")
            i = 0
            while not self.stop.is_set():
                i += 1
                statement, params = statements[i % 3]
                started = time.monotonic()
                try:
                    conn.execute(statement, params(i))
                except psycopg.Error as exc:
                    self.errors.append(str(exc).splitlines()[0])
                with self.lock:
                    self.samples.append((started, time.monotonic() - started))
                time.sleep(0.01)

    def between(self, start: float, end: float) -> list[float]:
        with self.lock:
            return [lat for at, lat in self.samples if start <= at <= end]

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(70)


def figures(latencies: list[float]) -> str:
    if not latencies:
        return "no writes"
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"{len(ms)} writes, p50 {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms, max {ms[-1]:.1f} ms"


class LockWatch:
    """How often an app writer's session waits on a lock: ``pg_stat_activity`` every 20 ms."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.waits: list[int] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.done.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'app-worker' "
                    "AND wait_event_type = 'Lock'"
                ).fetchone()
                self.waits.append(int(row[0]) if row else 0)
                time.sleep(0.02)

    def stop(self) -> tuple[int, int]:
        """(samples that saw an app session waiting on a lock, samples)"""
        self.done.set()
        self.thread.join(5)
        return sum(1 for w in self.waits if w), len(self.waits)


def watched_pass(world: World, sim_now: datetime) -> str:
    """The month-end retention pass while the app's writers run (2 connections, as ``lock``):
    its duration, slowest batch, what it deleted, the writes' latency and lock waits."""
    with world.engine.begin() as conn:
        targets = [str(t) for t in conn.execute(sa.text(STALE_ROWS)).scalars()]
    url = libpq_url(world.url)
    app = AppWriters(url, 2, targets)
    watch = LockWatch(url)
    t0 = time.monotonic()
    seconds, slowest, deleted = world.retention(sim_now)
    t1 = time.monotonic()
    waited, samples = watch.stop()
    app.close()
    with world.engine.begin() as conn:  # the writers' rows and the targets go (not the year's)
        conn.execute(
            sa.text("DELETE FROM reconcile_events WHERE job_id = ANY(CAST(:t AS uuid[]))"), {"t": targets}
        )
        conn.execute(sa.text("DELETE FROM jobs WHERE id = ANY(CAST(:t AS uuid[]))"), {"t": targets})
        conn.execute(sa.text("DELETE FROM jobs WHERE status = 'pending' AND provider_kind IS NULL"))
    return (
        f"; month-end pass {seconds:.2f} s, slowest batch {slowest * 1000:.0f} ms, deleted {deleted:,} "
        f"(rows, pages, runs); app writes during it: {figures(app.between(t0, t1))}, {waited} of "
        f"{samples} samples with an app session waiting on a lock, {len(app.errors)} errors"
    )


def lock(server: str, events: int, pass_s: float, writers: int) -> None:
    name = f"recon_bench_prune_{secrets.token_hex(3)}"
    ensure_database(server, name)
    url = with_database(server, name)
    engine = get_engine(url)
    try:
        migrate(engine)
        t0 = time.monotonic()
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute(
                "INSERT INTO jobs (user_id, job_type, status, provider_kind, provider_task_id, provider_call_started_at) "
                "SELECT gen_random_uuid(), 'image', 'processing', 'kie-standard', 't' || g, now() "
                "FROM generate_series(1, 2000) g"
            )
            for lo in range(0, events, 1_000_000):
                conn.execute(
                    "INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome, detail, run_id, cause, created_at) "
                    "SELECT md5(g::text)::uuid, 'kie-standard', 1 + g %% 3, 'recovered', 'upstream said succeeded', "
                    "md5('r' || g)::uuid::text, 'answered', now() - interval '400 days' + make_interval(secs => g / 10.0) "
                    "FROM generate_series(%s::int, %s::int) g",
                    [lo + 1, min(events, lo + 1_000_000)],
                )
            conn.execute("VACUUM ANALYZE reconcile_events")
            inflight = [str(r[0]) for r in conn.execute("SELECT id FROM jobs WHERE status = 'processing'")]
        print(
            f"lock: seeded {events:,} reconcile_events past retention in {time.monotonic() - t0:.1f} s",
            flush=True,
        )

        app = AppWriters(libpq_url(url), writers, inflight)
        time.sleep(3)
        p0 = time.monotonic()
        watch = LockWatch(libpq_url(url))
        cuts = cutoffs(datetime.now(UTC), HORIZONS)
        report = prune_pass(engine, cuts, batch=1000, budget_s=pass_s)
        p1 = time.monotonic()
        waits = watch.stop()
        app.close()
        print(
            f"  pruning pass: {report.seconds:.1f} s, {report.batches} batches of 1000, deleted "
            f"{report.deleted['reconcile_events']:,} ({report.deleted['reconcile_events'] / max(report.seconds, 1e-9):,.0f}/s), "
            f"slowest batch {report.slowest_batch_s * 1000:.0f} ms, finished {report.finished}"
        )
        print(f"  app writes before the pass: {figures(app.between(p0 - 3, p0))}")
        print(f"  app writes during the pass: {figures(app.between(p0, p1))}")
        print(
            f"  app sessions seen waiting on a lock: {waits[0]} of {waits[1]} samples "
            f"(every 20 ms); app write errors: {len(app.errors)}"
        )
    finally:
        dispose_engines()
        drop_database(server, name)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("year", "lock", "both"), default="both")
    parser.add_argument("--per-day", type=int, default=1000)
    parser.add_argument("--sampled-days", type=int, default=3, help="days through the real reconciler")
    parser.add_argument("--lock-events", type=int, default=2_000_000)
    parser.add_argument("--pass-s", type=float, default=60.0)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args(argv)
    server = normalize_url(args.database_url) if args.database_url else resolve_database_url()
    if args.part in ("year", "both"):
        year(server, args.per_day, args.sampled_days)
    if args.part in ("lock", "both"):
        lock(server, args.lock_events, args.pass_s, args.writers)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
