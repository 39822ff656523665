"""Migrations on a live app's database: the app's write latency while ``migrate`` runs (issue 35).

Builds an app-shaped database (the app's tables as the app has them, never created by
recon_dagster) with ``--rows`` jobs (1,000,000; about 1% in flight), starts a loop of app writes
(each thread: INSERT a job, UPDATE an in-flight job's progress, autocommit, as the app's workers
do), measures them for a few seconds, then applies every migration while the loop runs, and prints
the writes' p50 / p99 / max latency before and during the migration.

``--hold S``: an app transaction holds one jobs row (an UPDATE not committed) for the first S
seconds of the migration, as a worker between two writes does. ``--runner first-shipped`` applies
the migrations as they first shipped and as the runner before did (each file in one transaction,
indexes not CONCURRENTLY, no lock_timeout), for the side-by-side.

    RECON_DATABASE_URL=postgresql://root@127.0.0.1:5432/postgres \\
      .venv/bin/python benchmarks/migrate_live.py [--rows 1000000] [--writers 2] [--hold 0] [--runner current]
"""

from __future__ import annotations

import argparse
import hashlib
import secrets
import statistics
import sys
import threading
import time
import uuid
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
from recon_dagster.db.migrate import BOOKKEEPING_TABLE, migrate
from recon_dagster_tests.db.app_shaped import create_app_tables
from recon_dagster_tests.support.instance import drop_database, ensure_database

SHIPPED = Path(__file__).resolve().parent.parent / "recon_dagster_tests" / "db" / "shipped_migrations"

SEED = """
INSERT INTO jobs (user_id, job_type, status, progress, started_at, created_at, updated_at)
SELECT md5(g::text)::uuid,
       (ARRAY['image', 'video', 'audio', 'text'])[1 + g %% 4],
       CASE WHEN g %% 100 = 0 THEN 'processing' WHEN g %% 100 = 1 THEN 'pending'
            WHEN g %% 10 = 2 THEN 'failed' ELSE 'completed' END,
       100, now() - (g || ' seconds')::interval, now() - (g || ' seconds')::interval, now()
FROM generate_series(CAST(%s AS int), CAST(%s AS int)) AS g
"""


class Writers:
    """App writes in a loop on their own connections; each latency is kept with its start time."""

    def __init__(self, url: str, threads: int, inflight: list[str]) -> None:
        self.url = url
        self.inflight = inflight
        self.samples: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(threads)]
        for t in self.threads:
            t.start()

    def _loop(self, n: int) -> None:
        with psycopg.connect(self.url, autocommit=True, application_name="app-worker") as conn:
            conn.execute("SET statement_timeout = '60s'")
            i = 0
            while not self.stop.is_set():
                i += 1
                started = time.monotonic()
                try:
                    if i % 2:
                        conn.execute(
                            "INSERT INTO jobs (user_id, job_type, status) VALUES (%s, 'image', 'pending')",
                            [uuid.uuid4()],
                        )
                    else:
                        job = self.inflight[(i * 7919 + n) % len(self.inflight)]
                        conn.execute(
                            "UPDATE jobs SET progress = progress, updated_at = now() WHERE id = %s", [job]
                        )
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


def apply_first_shipped(url: str) -> None:
    """The first shipped texts the way the runner before did: each file whole, one transaction."""
    with psycopg.connect(url) as pg:
        pg.execute(
            f"CREATE TABLE IF NOT EXISTS {BOOKKEEPING_TABLE} (version int PRIMARY KEY, name text NOT NULL, "
            "checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        pg.commit()
        for path in sorted(SHIPPED.glob("*.sql")):
            pg.execute(path.read_bytes())
            pg.execute(
                f"INSERT INTO {BOOKKEEPING_TABLE} (version, name, checksum) VALUES (%s, %s, %s)",
                [int(path.name[:3]), path.stem, hashlib.sha256(path.read_bytes()).hexdigest()],
            )
            pg.commit()


def hold_a_row(url: str, job: str, seconds: float, started: threading.Event) -> None:
    with psycopg.connect(url, application_name="app-worker-holding-a-row") as conn:
        conn.execute("UPDATE jobs SET progress = 51 WHERE id = %s", [job])
        started.set()
        time.sleep(seconds)
        conn.commit()


def figures(latencies: list[float]) -> str:
    if not latencies:
        return "no writes"
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"{len(ms)} writes, p50 {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms, max {ms[-1]:.1f} ms"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument(
        "--hold", type=float, default=0.0, help="seconds an app transaction holds a row at the start"
    )
    parser.add_argument("--runner", choices=("current", "first-shipped"), default="current")
    parser.add_argument(
        "--baseline-s", type=float, default=3.0, help="seconds of writes measured before migrate"
    )
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args(argv)

    server = normalize_url(args.database_url) if args.database_url else resolve_database_url()
    name = f"recon_bench_migrate_{secrets.token_hex(4)}"
    ensure_database(server, name)
    url = with_database(server, name)
    engine = get_engine(url)
    try:
        create_app_tables(engine)
        t0 = time.monotonic()
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            for lo in range(1, args.rows + 1, 200_000):
                conn.execute(SEED, [lo, min(args.rows, lo + 199_999)])
            conn.execute("VACUUM ANALYZE jobs")
            inflight = [
                str(r[0]) for r in conn.execute("SELECT id FROM jobs WHERE status = 'processing' LIMIT 5000")
            ]
        print(
            f"seeded {args.rows:,} jobs ({len(inflight)} sampled in flight) in {time.monotonic() - t0:.1f} s",
            flush=True,
        )

        held, inflight = inflight[-1], inflight[:-1]  # the held row is none of the writers'
        writers = Writers(libpq_url(url), args.writers, inflight)
        time.sleep(args.baseline_s)
        holding = threading.Event()
        if args.hold > 0:
            threading.Thread(
                target=hold_a_row, args=(libpq_url(url), held, args.hold, holding), daemon=True
            ).start()
            holding.wait(10)
        said: list[str] = []
        m0 = time.monotonic()
        if args.runner == "current":
            applied = migrate(engine, say=said.append)
        else:
            apply_first_shipped(libpq_url(url))
            applied = [p.stem for p in sorted(SHIPPED.glob("*.sql"))]
        m1 = time.monotonic()
        time.sleep(0.5)
        writers.close()

        print(
            f"runner {args.runner}: applied {len(applied)} migration(s) in {m1 - m0:.1f} s "
            f"({len(said)} lock waits retried{'; hold ' + str(args.hold) + ' s' if args.hold else ''})"
        )
        print(f"  app writes before migrate: {figures(writers.between(m0 - args.baseline_s, m0))}")
        print(f"  app writes during migrate: {figures(writers.between(m0, m1))}")
        if writers.errors:
            print(f"  app write errors: {len(writers.errors)} (first: {writers.errors[0]})")
        with engine.connect() as conn:
            invalid = conn.execute(sa.text("SELECT count(*) FROM pg_index WHERE NOT indisvalid")).scalar()
        print(f"  invalid indexes left: {invalid}")
    finally:
        dispose_engines()
        drop_database(server, name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
