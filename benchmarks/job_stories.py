"""Time what recording ``job_story`` costs a reconcile run: the stories of a batch of jobs.

Runs in a throwaway database on the configured server (RECON_DATABASE_URL) or the embedded one,
dropped at the end, with a temporary Dagster instance. Each job has ``--attempts`` reconcile
events (its story's rows) and a credit reservation; one op records the stories of ``--jobs`` of
them (partitions added, one materialization each), as a batch run's ``record_outcomes`` does.
Prints the wall time per batch and per job. ``--instance postgres`` records them in a Dagster
instance on PostgreSQL (dagster-postgres, a temporary ``<db>_dagster`` storage database on the same
server, as a deployment runs), the default in a temporary SQLite one.

    .venv/bin/python benchmarks/job_stories.py [--jobs 100] [--attempts 17] [--instance postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import dagster as dg
import sqlalchemy as sa
from harness import throwaway_database

from recon_dagster.db.engine import get_engine, redact
from recon_dagster.db.migrate import migrate
from recon_dagster.defs.explain.stories import PARTITIONS, record_stories


def seed(engine: sa.Engine, jobs: int, attempts: int) -> list[uuid.UUID]:
    """``jobs`` in-flight KIE jobs of one user, each with ``attempts`` still-running events."""
    user = uuid.uuid4()
    ids = [uuid.uuid4() for _ in range(jobs)]
    with engine.begin() as conn:
        for j in ids:
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (id, user_id, job_type, status, provider_kind, provider_task_id, "
                    "provider_call_started_at, reconcile_attempts) "
                    "VALUES (:j, :u, 'image', 'processing', 'kie-standard', :t, now() - interval '2 hours', :a)"
                ),
                {"j": str(j), "u": str(user), "t": f"bench-{j.hex[:12]}", "a": attempts},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome, detail, run_key, cause) "
                    "SELECT :j, 'kie-standard', n, 'still_running', 'upstream still running', 'bench', 'answered' "
                    "FROM generate_series(1, :a) n"
                ),
                {"j": str(j), "a": attempts},
            )
    return ids


@contextlib.contextmanager
def dagster_instance(kind: str, url: str) -> Iterator[Any]:
    """A temporary Dagster instance: SQLite (``instance_for_test``) or on PostgreSQL."""
    if kind == "sqlite":
        with dg.instance_for_test() as instance:
            yield instance
        return
    from recon_dagster_tests.support.instance import dagster_home

    with dagster_home(url) as home, home.instance() as instance:
        yield instance


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--attempts", type=int, default=17)
    parser.add_argument("--instance", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--partitions", type=int, default=0, help="job_story partitions in the instance")
    args = parser.parse_args()
    with throwaway_database() as url:
        engine = get_engine(url)
        migrate(engine)
        ids = seed(engine, args.jobs, args.attempts)
        print(
            f"database: {redact(url)}; Dagster instance: {args.instance}; "
            f"{args.jobs} jobs x {args.attempts} attempts"
        )
        timings: list[float] = []

        @dg.op
        def record(context) -> int:  # unannotated: Dagster reads a string annotation as no type
            start = time.perf_counter()
            done = record_stories(context, engine, ids)
            timings.append(time.perf_counter() - start)
            return done

        @dg.job
        def bench() -> None:
            record()

        with dagster_instance(args.instance, url) as instance:
            for label in ("first (partitions added)", "again (partitions exist)"):
                result = bench.execute_in_process(instance=instance)
                assert result.success and result.output_for_node("record") == args.jobs
                t = timings[-1]
                print(
                    f"{label}: {t * 1000:.0f} ms for {args.jobs} stories, {t / args.jobs * 1000:.1f} ms per job"
                )
            # What stuck_jobs pays per refresh to link only to pages that exist (one look per row).
            start = time.perf_counter()
            found = sum(instance.has_dynamic_partition(PARTITIONS, str(j)) for j in ids)
            t = time.perf_counter() - start
            print(
                f"has_dynamic_partition: {t * 1000:.0f} ms for {found} rows, {t / args.jobs * 1000:.2f} ms per row"
            )
            # The other way: every partition in one query, at the instance's size (--partitions).
            extra = max(args.partitions - args.jobs, 0)
            if extra:
                instance.add_dynamic_partitions(PARTITIONS, [str(uuid.uuid4()) for _ in range(extra)])
            start = time.perf_counter()
            every = set(instance.get_dynamic_partitions(PARTITIONS))
            found = sum(str(j) in every for j in ids)
            t = time.perf_counter() - start
            print(
                f"get_dynamic_partitions: {t * 1000:.0f} ms for {len(every)} partitions ({found} rows found)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
