"""A backlog drained by the real daemon under ``RECON_DB_MAX_CONNECTIONS=20`` against a database
that allows recon_dagster exactly 20 connections (a role with ``CONNECTION LIMIT 20``, as a managed
database's user has): the run queue follows the budget (8 runs at once), every run keeps to its
share, nothing fails with "too many connections", and the role's connections, sampled all along,
never pass 20. Dagster's own storage is another database on an admin role, counted apart."""

from __future__ import annotations

import secrets
import threading
from decimal import Decimal
from pathlib import Path

import dagster as dg
import psycopg
import pytest
import sqlalchemy as sa
import yaml

from recon_dagster.core.kinds import get_kind
from recon_dagster.db import budget
from recon_dagster.db.engine import libpq_url
from recon_dagster_tests.support.daemon import daemon_process
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.harness import wait_for
from recon_dagster_tests.support.instance import dagster_home
from recon_dagster_tests.support.reconcile import one
from recon_dagster_tests.support.sandbox_process import sandbox_process

pytestmark = pytest.mark.daemon

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 20
KINDS = ("kie-standard", "kie-lip-sync", "kie-veo", "replicate-prediction", "elevenlabs-async")
UNBOUNDED = "reads=1000000/60,creates=1000000/60,concurrency=none"


class PeakConnections:
    """The most connections ``role`` held at once, sampled every 0.1 s from pg_stat_activity."""

    def __init__(self, admin_url: str, role: str) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(libpq_url(admin_url), role), daemon=True)

    def _sample(self, url: str, role: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not self._stop.wait(0.1):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (role,)
                ).fetchone()
                self.peak = max(self.peak, int(row[0]) if row else 0)

    def __enter__(self) -> PeakConnections:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture
def limited_role(engine: sa.Engine, database_url: str):
    """A login role allowed ``BUDGET`` connections, with the app's privileges on the session database."""
    role = f"recon_budget_{secrets.token_hex(3)}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT {BUDGET}"))
        conn.execute(sa.text(f"GRANT USAGE ON SCHEMA public TO {role}"))
        conn.execute(sa.text(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}"))
        conn.execute(sa.text(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}"))
        # The contract's functions (the account limiter calls them), as deploy/roles.sql grants them.
        conn.execute(sa.text(f"GRANT recon_app_worker TO {role}"))
    yield role
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        )
        conn.execute(sa.text(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}"))
        conn.execute(sa.text(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {role}"))
        conn.execute(sa.text(f"REVOKE USAGE ON SCHEMA public FROM {role}"))
        conn.execute(sa.text(f"REVOKE recon_app_worker FROM {role}"))
        conn.execute(sa.text(f"DROP ROLE {role}"))


def test_a_backlog_under_a_budget_of_20_never_runs_out_of_connections(
    db, database_url: str, limited_role: str, tmp_path: Path
) -> None:
    app_url = sa.make_url(database_url).set(username=limited_role).render_as_string(hide_password=False)
    with sandbox_process(latency_s=0.2, log_dir=tmp_path) as sandbox:
        user = make_user(db, sub=100_000, topup=0)
        jobs = []
        for i in range(120):
            kind = KINDS[i % len(KINDS)]
            task = sandbox.add_task(kind, {"outcome": "fail" if i % 7 == 6 else "succeed", "polls_before_done": 0,
                                           "media_size": 256})  # fmt: skip
            minutes = get_kind(kind).stale_threshold.total_seconds() / 60 + 5
            job = make_job(db, user, provider_kind=kind, provider_task_id=task, started_minutes_ago=minutes)
            reserve(db, job, user, Decimal(2))
            jobs.append(job)
        env = {
            **sandbox.env,
            "RECON_DATABASE_URL": app_url,
            "RECON_DB_MAX_CONNECTIONS": str(BUDGET),
            "RECON_MEDIA_DIR": str(tmp_path / "media"),
            "RECON_SENSOR_INTERVAL_S": "1",
            "RECON_BATCH_SIZE": "10",  # many small runs: the queue is full all along
            "RECON_SINGLE_RUN_BELOW": "2",
            "RECON_LIMITS": "database",
            **{f"RECON_LIMIT_{p}": f"{UNBOUNDED},account={p.lower()}-{secrets.token_hex(3)}"
               for p in ("KIE", "REPLICATE", "ELEVENLABS")},
        }  # fmt: skip
        with dagster_home(database_url) as home:
            # The shipped dagster.yaml, its run queue following the budget (what the refusal says).
            shipped = yaml.safe_load((ROOT / "dagster.yaml").read_text())
            shipped["run_queue"]["max_concurrent_runs"] = budget.most_runs_at_once(BUDGET)
            assert shipped["run_queue"]["max_concurrent_runs"] == 8
            home.dagster_yaml.write_text(yaml.safe_dump(shipped, sort_keys=False))

            def left() -> int:
                return one(
                    db,
                    "SELECT count(*) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[])) AND status IN ('pending','processing')",
                    ids=[str(j) for j in jobs],
                )

            with PeakConnections(database_url, limited_role) as peak, daemon_process(home, env) as daemon:
                wait_for(lambda: left() == 0, timeout_s=600, interval_s=1, what="the backlog to drain",
                         logs=daemon.log_tail)  # fmt: skip
                with home.instance() as inst:
                    runs = wait_for(
                        lambda: (
                            inst.get_runs(filters=dg.RunsFilter(job_name="reconcile_job"))
                            if all(r.is_finished for r in inst.get_runs())
                            else []
                        ),
                        timeout_s=120, what="the runs to finish", logs=daemon.log_tail,
                    )  # fmt: skip
                    messages = [e.message or "" for r in runs for e in inst.all_logs(r.run_id)]
                log = daemon.log_tail(200_000)
    assert len(runs) >= 12
    assert [r.status for r in runs if r.status is not dg.DagsterRunStatus.SUCCESS] == []
    for text in (log, *messages):
        assert "too many" not in text.lower(), text[-2000:]
    assert 0 < peak.peak <= BUDGET, peak.peak
    errors = one(
        db,
        "SELECT count(*) FROM reconcile_events WHERE job_id = ANY(CAST(:ids AS uuid[])) AND outcome = 'error'",
        ids=[str(j) for j in jobs],
    )
    assert errors == 0
