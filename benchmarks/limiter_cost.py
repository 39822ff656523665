"""Cost of one acquire of a shared (PostgreSQL) rate limit: ours against pyrate-limiter's.

- ours: ``AccountLimiter.take_token`` (one ``UPDATE ... RETURNING`` on the account's bucket row),
  and a whole request's worth (``request()``: slot taken, token reserved, slot released);
- pyrate-limiter ``PostgresBucket``: ``LOCK TABLE ... NOWAIT``, a windowed ``count(*)``, one
  ``INSERT`` per acquire (a sliding log), through a ``psycopg_pool`` pool.

Each is timed from one thread and from ``--threads`` threads at once (contention on one account),
with a budget too large to bind, so the figures are the limiter's own cost. pyrate-limiter and
psycopg-pool are not dependencies of the project: install them to include that column
(``pip install pyrate-limiter psycopg-pool``).

    .venv/bin/python benchmarks/limiter_cost.py [--n 2000] [--threads 8] [--database-url URL]
"""

from __future__ import annotations

import argparse
import secrets
import threading
import time
from collections.abc import Callable

from recon_dagster.db.engine import (
    dispose_engines,
    get_engine,
    libpq_url,
    normalize_url,
    resolve_database_url,
    with_database,
)
from recon_dagster.db.migrate import migrate
from recon_dagster.providers.limits import AccountLimiter, AccountLimits, Budget
from recon_dagster_tests.support.instance import drop_database, ensure_database


def timed(fn: Callable[[], object], n: int, threads: int) -> tuple[float, int]:
    """Mean wall milliseconds per call with ``threads`` callers, and how many calls said no."""
    refused = [0]
    lock = threading.Lock()

    def work(count: int) -> None:
        for _ in range(count):
            if fn() is False:
                with lock:
                    refused[0] += 1

    per = n // threads
    started = time.perf_counter()
    pool = [threading.Thread(target=work, args=(per,)) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return (time.perf_counter() - started) / (per * threads) * 1000, refused[0]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    server = (
        normalize_url(args.database_url) if args.database_url else resolve_database_url(allow_embedded=True)
    )
    name = f"recon_bench_{secrets.token_hex(4)}"
    ensure_database(server, name)
    url = with_database(server, name)
    try:
        engine = get_engine(url)
        migrate(engine)
        ours = AccountLimiter(
            AccountLimits("bench", reads=Budget(10**9, 60), concurrency=64),
            lambda: engine,
            sleep=lambda s: None,
        )
        ours.ensure()

        def whole_request() -> None:
            with ours.request("kie-standard", create=False):
                pass

        rows = []
        for threads in (1, args.threads):
            ms, _ = timed(lambda: ours.take_token(create=False), args.n, threads)
            rows.append(("ours: take_token (UPDATE ... RETURNING)", threads, ms, 0))
            ms, _ = timed(whole_request, args.n, threads)
            rows.append(("ours: slot + token + release", threads, ms, 0))
        try:
            from psycopg_pool import ConnectionPool
            from pyrate_limiter import Duration, Limiter, PostgresBucket, Rate
        except ImportError:
            print("pyrate-limiter / psycopg-pool not installed: its column is skipped")
        else:
            pool = ConnectionPool(libpq_url(url), min_size=2, max_size=args.threads + 2, open=True)
            bucket = PostgresBucket(pool, "bench", [Rate(10**9, Duration.MINUTE)])
            limiter = Limiter(bucket)
            for threads in (1, args.threads):
                ms, refused = timed(lambda: limiter.try_acquire("bench", blocking=False), args.n, threads)
                rows.append(("pyrate-limiter PostgresBucket try_acquire", threads, ms, refused))
            with pool.connection() as conn:
                kept = conn.execute('SELECT count(*) FROM "ratelimit___bench"').fetchone()
            print(f"pyrate-limiter table rows after the runs: {kept[0] if kept else '?'} (one per acquire)")
            limiter.dispose(bucket) if hasattr(limiter, "dispose") else None
            pool.close()
        print(f"{'limiter':45} {'threads':>7} {'ms/acquire':>11} {'refused':>8}")
        for label, threads, ms, refused in rows:
            print(f"{label:45} {threads:>7} {ms:>11.3f} {refused:>8}")
    finally:
        dispose_engines()
        drop_database(server, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
