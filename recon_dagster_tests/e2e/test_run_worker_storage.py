"""A forked run worker's Dagster storage keeps its connections for the run.

dagster-postgres opens a connection per statement outside the webserver; the worker pools them
(``pool_storage_connections``). The run is executed by the launcher's own ``_run_worker`` in a
fresh interpreter, on dagster-postgres, and works real jobs against the loopback sandbox.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.reconstruct import ReconstructableRepository

from recon_dagster.core.kinds import get_kind
from recon_dagster.core.paths import project_root
from recon_dagster.runlauncher import pool_storage_connections
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.instance import dagster_home
from recon_dagster_tests.support.reconcile import one
from recon_dagster_tests.support.sandbox_process import sandbox_process

# Runs the worker and prints the connections each driver opened (psycopg2 is Dagster's storage).
_WORKER = """
import json, sys
from collections import Counter
import sqlalchemy as sa
opened = Counter()
sa.event.listen(sa.pool.Pool, "connect", lambda c, _r: opened.update([type(c).__module__.split(".")[0]]))
from recon_dagster.runlauncher import _run_worker
_run_worker(sys.argv[1], sys.argv[2])
print("OPENED " + json.dumps(opened))
"""


@pytest.mark.daemon
def test_a_run_worker_opens_a_few_storage_connections_not_one_per_event(
    db, database_url: str, tmp_path: Path
) -> None:
    kind = "kie-standard"
    with sandbox_process() as sandbox, dagster_home(database_url) as home:
        user = make_user(db, sub=1000, topup=0)
        jobs = []
        for _ in range(6):
            task = sandbox.add_task(kind, {"outcome": "succeed", "polls_before_done": 0})
            minutes = get_kind(kind).stale_threshold.total_seconds() / 60 + 5
            job = make_job(db, user, provider_kind=kind, provider_task_id=task, started_minutes_ago=minutes)
            reserve(db, job, user, Decimal(2))
            jobs.append(job)
        repo = ReconstructableRepository.for_module(
            "recon_dagster.definitions", fn_name="defs", working_directory=str(project_root())
        )
        recon_job = repo.get_reconstructable_job("reconcile_job")
        with home.instance() as instance:
            run = instance.create_run_for_job(
                job_def=recon_job.get_definition(),
                run_config={"ops": {"claim_and_poll": {"config": {"job_ids": [str(j) for j in jobs]}}}},
                tags={"dagster/partition": kind},
                job_code_origin=recon_job.get_python_origin(),
            )
            ref = dg.serialize_value(instance.get_ref())
            env = {
                **os.environ,
                **sandbox.env,
                **home.env(),
                "RECON_DATABASE_URL": database_url,
                "RECON_MEDIA_DIR": str(tmp_path / "media"),
            }
            done = subprocess.run(
                [sys.executable, "-c", _WORKER, ref, run.run_id],
                env=env,
                cwd=str(project_root()),
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert done.returncode == 0, done.stderr[-3000:]
            finished = instance.get_run_by_id(run.run_id)
            events = len(instance.all_logs(run.run_id))
        assert finished is not None and finished.status == dg.DagsterRunStatus.SUCCESS, done.stderr[-3000:]
        opened = json.loads(done.stdout.rsplit("OPENED ", 1)[1])
    left = one(
        db,
        "SELECT count(*) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[])) AND status = 'processing'",
        ids=[str(j) for j in jobs],
    )
    assert left == 0
    # Before: one connection per event written and per run read (~90 for this run's ~60 events).
    assert events >= 40
    assert opened.get("psycopg2", 0) <= 12, f"{opened} for {events} events"


def test_pooling_is_skipped_with_a_warning_where_storage_cannot_pool(caplog) -> None:
    """An instance whose storage has nothing to pool (in memory) runs on as it is."""
    with dg.instance_for_test() as instance:
        pool_storage_connections(instance)  # SQLite storage: accepted or refused, never raised
        assert instance.get_runs() == []
