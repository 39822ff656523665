"""Behind PgBouncer in transaction mode (a real PgBouncer on loopback in front of the session's
server): with ``RECON_DB_TRANSACTION_POOLER=1`` a reconcile pass recovers every job; without it,
psycopg's server-side prepared statements collide on the server connections PgBouncer shares."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from recon_dagster.db.engine import libpq_url
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.support.pgbouncer import pgbouncer

pytestmark = pytest.mark.skipif(
    shutil.which("pgbouncer") is None
    and not Path("/usr/sbin/pgbouncer").exists()
    and os.environ.get("CI") is None,
    reason="needs Debian's pgbouncer (apt-get install pgbouncer; .ci/run installs it)",
)

KINDS = ("kie-standard", "replicate-prediction")


def test_without_the_setting_prepared_statements_collide_behind_pgbouncer(database_url: str) -> None:
    # Why the setting exists: two clients on PgBouncer's one server connection; the first's
    # statement, run past psycopg's prepare threshold, is prepared on that server connection under
    # the name the second client then prepares too.
    with pgbouncer(database_url, pool_size=1) as bouncer:
        url = libpq_url(bouncer.url(database_url))
        with psycopg.connect(url, autocommit=True) as first, psycopg.connect(url, autocommit=True) as second:
            for _ in range(8):
                first.execute("SELECT count(*) FROM pg_class WHERE relname = %s", ("jobs",))
            with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
                for _ in range(8):
                    second.execute("SELECT count(*) FROM pg_class WHERE relname = %s", ("jobs",))


@pytest.mark.slow
def test_reconcile_once_through_pgbouncer_in_transaction_mode(
    db, sandbox, database_url: str, tmp_path: Path
) -> None:
    user = make_user(db, sub=10_000, topup=0)
    jobs = []
    # Enough jobs per run that every statement runs past psycopg's prepare threshold (5) on each of
    # the run's connections.
    for i in range(60):
        kind = KINDS[i % len(KINDS)]
        scenario = Scenario(polls_before_done=0, outcome="fail" if i % 5 == 4 else "succeed")
        task = sandbox.add_task(kind, scenario)
        job = make_job(db, user, provider_kind=kind, provider_task_id=task, started_minutes_ago=24 * 60)
        reserve(db, job, user, Decimal(3))
        jobs.append(job)
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    # One server connection for every client: each transaction may follow another client's.
    with pgbouncer(database_url, pool_size=1) as bouncer:
        env = {
            **os.environ,
            **sandbox.env(),
            "RECON_DATABASE_URL": bouncer.url(database_url),
            "RECON_DB_TRANSACTION_POOLER": "1",
            "RECON_MEDIA_DIR": str(tmp_path / "media"),
            "DAGSTER_HOME": str(home),
            "RECON_SINGLE_RUN_BELOW": "2",
        }
        done = subprocess.run(
            [sys.executable, "-m", "recon_dagster.cli", "reconcile", "--once"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        log = bouncer.log()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = re.search(r"recovered=(\d+) failed=(\d+) stillRunning=(\d+) errors=(\d+)", done.stdout)
    assert summary, done.stdout
    recovered, failed, running, errors = map(int, summary.groups())
    assert (recovered + failed, running, errors) == (len(jobs), 0, 0), done.stdout
    assert {job_row(db, j)["status"] for j in jobs} <= {"completed", "failed"}
    assert "prepared statement" not in done.stdout + done.stderr + log
