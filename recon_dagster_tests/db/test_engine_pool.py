"""A run's threads share a pool that opens each connection once: with the default settings, short
transactions from more threads than the pool holds, between stretches of other work (a poll, a
download), never open and close connections over and over (real PostgreSQL)."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import sqlalchemy as sa

from recon_dagster import config
from recon_dagster.db.engine import _create_engine

THREADS = 16  # a reconcile run's default concurrency
TRANSACTIONS = 40  # per thread


def test_sixteen_threads_of_short_transactions_open_no_more_than_the_cap(database_url: str) -> None:
    cap = config.get("RECON_DB_POOL_SIZE") + config.get("RECON_DB_MAX_OVERFLOW")
    engine = _create_engine(database_url)
    opened: list[int] = []
    lock = threading.Lock()

    @sa.event.listens_for(engine, "connect")
    def _connected(_dbapi_connection: object, _record: object) -> None:
        with lock:
            opened.append(1)

    def work(seed: int) -> int:
        rng = random.Random(seed)
        done = 0
        for _ in range(TRANSACTIONS):
            time.sleep(rng.uniform(0, 0.006))  # a poll or a download: no connection held
            with engine.begin() as conn:
                conn.execute(sa.text("SELECT pg_sleep(0.002)"))
            done += 1
        return done

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            assert sum(pool.map(work, range(THREADS))) == THREADS * TRANSACTIONS
    finally:
        engine.dispose()
    # Before (pool 5 + overflow 5): every connection above five was closed when returned and
    # opened again by the next thread that needed one, dozens of times for the same peak.
    assert len(opened) <= cap, f"{len(opened)} connections opened for a cap of {cap}"
