"""The ``postgres.restart`` fault: the embedded PostgreSQL stopped (fast shutdown: every session
cut) and started again under a running app worker, then recovery through ``reconcile --once``.

It needs a server this process may stop, so it always runs on a private embedded server (its own
data folder under the work folder), never on a shared one.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

from recon_dagster.db.embedded import PGDATA_ENV, embedded_url, stop_embedded
from recon_dagster.db.engine import dispose_engines, get_engine, with_database
from recon_dagster.db.migrate import migrate
from recon_dagster_tests.chaos import checks, harness, runner, worlds
from recon_dagster_tests.support.harness import wait_for
from recon_dagster_tests.support.instance import ensure_database
from recon_dagster_tests.support.sandbox_process import SandboxProcess

CASE = "worker:postgres.restart"


@contextlib.contextmanager
def private_embedded(pgdata: Path) -> Iterator[str]:
    """A private embedded server on ``pgdata``; yields its ``postgres`` URL; stopped at exit."""
    saved = os.environ.get(PGDATA_ENV)
    os.environ[PGDATA_ENV] = str(pgdata)
    try:
        yield embedded_url("postgres")
    finally:
        with contextlib.suppress(Exception):
            stop_embedded()
        if saved is None:
            os.environ.pop(PGDATA_ENV, None)
        else:
            os.environ[PGDATA_ENV] = saved


def tasks_persisted(engine: sa.Engine, jobs: list[worlds.Job]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[])) AND provider_task_id IS NOT NULL"
                ),
                {"ids": [str(j.id) for j in jobs]},
            ).scalar_one()
        )


def run_postgres_restart(
    sandbox: SandboxProcess, work: Path, *, seed: int, jobs: int, rounds: int
) -> checks.PointReport:
    """``rounds`` rounds of ``jobs`` jobs: a worker over them, PostgreSQL restarted mid-run."""
    report = checks.PointReport(CASE)
    media = work / "media-pg"
    media.mkdir(exist_ok=True)
    with private_embedded(work / "pgdata") as server_url:
        ensure_database(server_url, "recon_chaos_pg")
        url = with_database(server_url, "recon_chaos_pg")
        engine = get_engine(url)
        migrate(engine)
        env = runner.base_env(url, sandbox, media)
        for r in range(rounds):
            seed_r = harness.round_seed(seed, len(worlds.CASES), r)
            rng = random.Random(seed_r)
            batch, specs = worlds.seed_jobs(engine, sandbox, rng, jobs, CASE)
            for spec in specs:  # long enough jobs that the restart lands while they run
                spec["scenario"]["polls_before_done"] = rng.randint(10, 60)
            spec_file = work / f"specs-pg-{seed_r}.json"
            spec_file.write_text(json.dumps(specs))
            log = open(work / f"round-pg-{seed_r}.log", "wb")  # noqa: SIM115 (closed below)
            worker = subprocess.Popen(
                [sys.executable, "-c", worlds.WORKER_SCRIPT, str(spec_file)],
                env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

            # Restart once the worker has created upstream tasks, at a seeded moment of its polling.
            def started(w: subprocess.Popen = worker, e: sa.Engine = engine, b: list = batch) -> bool:
                return w.poll() is not None or tasks_persisted(e, b) >= len(b) // 2

            wait_for(started, timeout_s=60, what="the worker to start its jobs")
            time.sleep(rng.random() * 1.5)
            live = worker.poll() is None
            stop_embedded()
            time.sleep(rng.random() * 2)
            embedded_url("postgres")  # start again on the same folder and socket
            dispose_engines()  # our own pooled sessions died with the server
            engine = get_engine(url)
            try:
                worker.wait(timeout=120)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(timeout=30)
            log.close()
            ids = [j.id for j in batch]
            runner.recover(engine, ids, runner.reconcile_env(env, jobs), work)
            rep = checks.check(engine, sandbox, media, batch)[CASE]
            checks.merge(report, rep)
            report.rounds += 1
            report.killed_at_point += int(live)  # the restart hit a running worker
            report.seeds.append(seed_r)
        dispose_engines()
    return report
