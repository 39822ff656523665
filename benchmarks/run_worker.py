"""CPU of one reconcile run worker, measured by the kernel: a repeatable figure for A/B changes.

``backlog.py`` measures the whole daemon tree, but on a 2-core machine its CPU per job moves by
20-30 % between two runs of the same code (ten runs at once, a sensor, a code server and the
PostgreSQL server share the cores). Run workers are ~80 % of that tree. This benchmark runs one
reconcile run at a time, as the daemon would launch it, and reads the worker's own CPU from
``getrusage`` (every thread, user + system): the spread between repeats is a few per cent.

Each repeat: ``--jobs`` stale rows of one kind (``--fail-share`` failed upstream, the rest succeeded
with ``--media-bytes`` of media), their tasks in the provider sandbox (``--latency`` per answer);
one ``reconcile_job`` run whose config and tags are the sensor's (``run_request_for``), created in
a fresh DAGSTER_HOME on dagster-postgres and executed as Dagster's code server executes a run: a
fresh interpreter (``spawn``) that opens the instance and runs ``dagster api execute_run``'s body.
It reports the run's CPU per job (the interpreter's start and imports included, as in every real
run worker), its wall time and the Dagster events it wrote, and checks that every job is terminal.

    PYTHONPATH=. .venv/bin/python benchmarks/run_worker.py [--jobs 700] [--repeats 5]
        [--kind kie-lip-sync] [--latency 0.1] [--database-url URL] [--env NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
import uuid

# Only the standard library at the top: the spawned workers import this file as their main module
# (``__mp_main__``) to find ``measured_worker``, and the project's modules must be imported by the
# run itself, as in a real worker, not ahead of it.


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def seed_kind(engine, sandbox, kind: str, count: int, fail_share: float, media_bytes: int, rng, watermark):
    """``count`` stale rows of ``kind`` with reserved credits, their tasks already done upstream."""
    from harness import insert_jobs

    from recon_dagster.core.kinds import get_kind

    tag = secrets.token_hex(3)
    job_ids = [str(uuid.uuid4()) for _ in range(count)]
    users = [str(uuid.uuid4()) for _ in range(max(1, count // 20))]
    user_of = [users[i % len(users)] for i in range(count)]
    task_ids = [f"rw-{tag}-{i}" for i in range(count)]
    specs = [
        (
            kind,
            {
                "outcome": "fail" if rng.random() < fail_share else "succeed",
                "polls_before_done": 0,
                "media_size": media_bytes,
            },
            t,
        )
        for t in task_ids
    ]
    sandbox.add_tasks(specs)
    age_s = get_kind(kind).stale_threshold.total_seconds() + 600
    insert_jobs(engine, job_ids, user_of, [kind] * count, task_ids, [age_s] * count, watermark=watermark)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE jobs")
    return job_ids


def measured_worker(serialized_ref: str, run_id: str, out_path: str) -> None:
    """Runs in the spawned worker: ``dagster api execute_run``'s body, then this process's CPU."""
    import resource
    from collections import Counter

    import dagster as dg
    import sqlalchemy as sa
    from dagster._cli.api import _execute_run_command_body
    from dagster._core.instance.ref import InstanceRef

    # Connections opened and checked out, per driver: psycopg2 is Dagster's storage, psycopg ours.
    opened: Counter[str] = Counter()
    checkouts: Counter[str] = Counter()

    def _driver(dbapi_connection) -> str:
        return type(dbapi_connection).__module__.split(".")[0]

    sa.event.listen(sa.pool.Pool, "connect", lambda c, _r: opened.update([_driver(c)]))
    sa.event.listen(sa.pool.Pool, "checkout", lambda c, _r, _p: checkouts.update([_driver(c)]))
    with dg.DagsterInstance.from_ref(dg.deserialize_value(serialized_ref, InstanceRef)) as instance:
        _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=False)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(out_path, "w") as f:
        json.dump(
            {
                "user": usage.ru_utime,
                "sys": usage.ru_stime,
                "maxrss_kb": usage.ru_maxrss,
                "opened": dict(opened),
                "checkouts": dict(checkouts),
            },
            f,
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--jobs", type=int, default=700, help="jobs in the run (a 10,000-job backlog's runs hold ~700)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kind", default="kie-lip-sync")
    parser.add_argument("--latency", type=float, default=0.1, help="seconds per sandbox answer")
    parser.add_argument("--fail-share", type=float, default=0.1)
    parser.add_argument("--media-bytes", type=int, default=16 * 1024)
    parser.add_argument("--watermark", choices=("default", "on", "off"), default="off")
    parser.add_argument("--limits", choices=("unbounded", "shipped", "process"), default="unbounded")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="set in the run workers"
    )
    args = parser.parse_args()
    if args.jobs < 1 or args.repeats < 1:
        parser.error("--jobs and --repeats must be at least 1")
    extra = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--env takes NAME=VALUE, got {item!r}")
        extra[name] = value

    import dagster as dg
    import sqlalchemy as sa
    from dagster._core.definitions.reconstruct import ReconstructableRepository
    from harness import LIMIT_MODES, WATERMARK, compile_project  # benchmarks/ is on sys.path

    from recon_dagster.db.engine import (
        DATABASE_URL_ENV,
        dispose_engines,
        get_engine,
        normalize_url,
        redact,
        resolve_database_url,
        with_database,
    )
    from recon_dagster.db.jobs import Claim
    from recon_dagster.db.migrate import migrate
    from recon_dagster.reconcile.batches import Batch, run_key_for
    from recon_dagster_tests.support.instance import dagster_home, drop_database, ensure_database
    from recon_dagster_tests.support.sandbox_process import sandbox_process

    server_url = (
        normalize_url(args.database_url) if args.database_url else resolve_database_url(allow_embedded=True)
    )
    name = f"recon_bench_{secrets.token_hex(4)}"
    ensure_database(server_url, name)
    url = with_database(server_url, name)
    media_dir = tempfile.mkdtemp(prefix="recon-bench-media-")
    rng = random.Random(args.seed)
    print(
        f"database {redact(url)}; {args.repeats} runs of {args.jobs} {args.kind} jobs, latency "
        f"{args.latency * 1000:g} ms, limits {args.limits}, watermark {args.watermark}, env {extra or '-'}, "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    results = []
    try:
        engine = get_engine(url)
        migrate(engine)
        compile_project()
        with sandbox_process(latency_s=args.latency) as sandbox, dagster_home(url) as home:
            os.environ.update(
                {
                    DATABASE_URL_ENV: url,
                    "RECON_MEDIA_DIR": media_dir,
                    **LIMIT_MODES[args.limits],
                    **sandbox.env,
                    **home.env(),
                    **extra,
                }
            )
            # A fresh interpreter per run, as Dagster's code server starts its run workers.
            context = multiprocessing.get_context("spawn")
            from recon_dagster.defs.reconcile.sensors import run_request_for

            repo = ReconstructableRepository.for_module(
                "recon_dagster.definitions", fn_name="defs", working_directory=os.getcwd()
            )
            recon_job = repo.get_reconstructable_job("reconcile_job")
            with home.instance() as instance:
                ref = dg.serialize_value(instance.get_ref())
                job_def = recon_job.get_definition()
                for i in range(args.repeats):
                    ids = seed_kind(
                        engine, sandbox, args.kind, args.jobs, args.fail_share, args.media_bytes, rng,
                        WATERMARK[args.watermark],
                    )  # fmt: skip
                    claims = tuple(Claim(uuid.UUID(j), 1) for j in ids)
                    request = run_request_for(Batch(args.kind, claims, run_key_for(args.kind, claims)))
                    tags = {
                        **request.tags,
                        "dagster/partition": args.kind,
                        "dagster/run_key": request.run_key,
                    }
                    run = instance.create_run_for_job(
                        job_def=job_def,
                        run_config=request.run_config,
                        tags=tags,
                        job_code_origin=recon_job.get_python_origin(),
                    )
                    out = os.path.join(media_dir, f"cpu-{i}.json")
                    events_before = _events(instance, run.run_id)
                    started = time.monotonic()
                    worker = context.Process(target=measured_worker, args=(ref, run.run_id, out))
                    worker.start()
                    worker.join()
                    wall = time.monotonic() - started
                    status = instance.get_run_by_id(run.run_id).status
                    with engine.connect() as conn:
                        left = conn.execute(
                            sa.text(
                                "SELECT count(*) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[])) AND status = 'processing'"
                            ),
                            {"ids": ids},
                        ).scalar_one()
                    with open(out) as f:
                        cpu = json.load(f)
                    cpu_s = cpu["user"] + cpu["sys"]
                    events = _events(instance, run.run_id) - events_before
                    results.append(cpu_s / args.jobs * 1000)
                    print(
                        f"run {i + 1}: {status.value}, {cpu_s:.2f} s CPU ({cpu['user']:.2f} user + {cpu['sys']:.2f} sys) "
                        f"= {cpu_s / args.jobs * 1000:.2f} ms/job; wall {wall:.1f} s; {events} Dagster events; "
                        f"{left} job(s) still processing; max RSS {cpu['maxrss_kb'] / 1024:.0f} MiB; "
                        f"connections opened {cpu['opened']}, checked out {cpu['checkouts']}",
                        flush=True,
                    )
    finally:
        dispose_engines()
        drop_database(server_url, name)
        import shutil

        shutil.rmtree(media_dir, ignore_errors=True)
    if results:
        print(
            f"CPU per job: median {statistics.median(results):.2f} ms, min {min(results):.2f}, max {max(results):.2f} "
            f"over {len(results)} runs of {args.jobs} jobs"
        )
    return 0


def _events(instance, run_id: str) -> int:
    return len(instance.all_logs(run_id))


if __name__ == "__main__":
    raise SystemExit(main())
