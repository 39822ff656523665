"""A rolling upgrade: migrate first, then roll. The previous release (0.2.0, built from its release
commit into a venv of its own) runs its worker library and its reconciler against a database the
current code migrated, through a backlog; then the current release takes over. Nothing is lost,
nothing settles twice. And a release refuses a schema that no longer serves it, with one line."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from packaging.requirements import Requirement

from recon_dagster.db.engine import dispose_engines, get_engine
from recon_dagster.db.schema_contract import CONTRACT, SchemaContractError
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support import previous_release as prev
from recon_dagster_tests.support.factories import make_job, make_user, reserve, sql

CREDITS = 10


def _env(database_url: str, media_dir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECON_CRASH_", "PYTHON"))}
    env.pop("DAGSTER_HOME", None)  # a throwaway instance per process
    return {
        **env,
        "RECON_DATABASE_URL": database_url,
        "RECON_MEDIA_DIR": media_dir,
        "RECON_RECONCILE_CADENCE_S": "0",
    }


def _run(python: Path | str, args: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run([str(python), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


_OLD_WORKER = textwrap.dedent(
    """
    import sys
    from recon_dagster.worker import providers_from_env, run_or_resume

    providers = providers_from_env()
    payload = {"model": "google/nano-banana", "input": {"prompt": "a cat"}, "sandbox_kind": "kie-standard"}
    for job_id in sys.argv[1:]:
        # The worker creates the task, persists its id through the callback, and dies mid-poll.
        def create(on_task_created):
            on_task_created(providers.kie.create("kie-standard", payload))
            return None
        run_or_resume(job_id, "kie-standard", create, providers=providers)
    """
)


@pytest.mark.daemon
def test_the_previous_release_and_this_one_share_a_migrated_database(
    db: sa.Engine, database_url: str, sandbox, media_dir: str, tmp_path: Path
) -> None:
    if not prev.has_commit():
        if os.environ.get("CI"):
            pytest.fail(f"the release commit {prev.COMMIT} is not in this clone's history")
        pytest.skip(f"the release commit {prev.COMMIT} is not in this clone's history (a shallow clone)")
    # Sharing this venv's dependencies is only right while every requirement of the release is
    # met by what this venv has installed (a newer release may add requirements of its own).
    unmet = [
        str(req)
        for req in map(Requirement, prev.runtime_dependencies(prev.release_pyproject()))
        if not req.specifier.contains(importlib.metadata.version(req.name), prereleases=True)
    ]
    assert unmet == [], f"the release needs what this venv does not have: {unmet}"
    old = prev.build(tmp_path / "previous")
    cwd = tmp_path / "cwd"
    cwd.mkdir()  # never the checkout: its recon_dagster/ would shadow the installed one
    env = _env(database_url, media_dir)
    where = _run(old, ["-c", "import recon_dagster as r; print(r.__version__, r.__file__)"], env, cwd).split()
    assert where[0] == prev.RELEASE and str(tmp_path) in where[1]

    user = make_user(db, sub=1000, topup=0)
    jobs: dict[str, list[uuid.UUID]] = {
        "done": [],
        "fail": [],
        "slow": [],
        "old_worker": [],
        "new_worker": [],
    }

    def stuck(group: str, kind: str, scenario: Scenario) -> None:
        job = make_job(
            db,
            user,
            provider_kind=kind,
            provider_task_id=sandbox.add_task(kind, scenario),
            started_minutes_ago=60,
        )
        reserve(db, job, user, CREDITS)
        jobs[group].append(job)

    for _ in range(4):
        stuck("done", "kie-standard", Scenario(polls_before_done=0))
        stuck("slow", "kie-standard", Scenario(polls_before_done=1))  # running for the old, done for the new
    for _ in range(3):
        stuck("fail", "kie-kontext", Scenario(outcome="fail", polls_before_done=0))
    sandbox.set_default_scenario("kie-standard", Scenario(polls_before_done=0))
    for group in ("old_worker", "new_worker"):
        for _ in range(2):
            job = make_job(db, user)
            reserve(db, job, user, CREDITS)
            jobs[group].append(job)

    # The previous release's worker library creates tasks and dies; its reconciler runs a tick.
    _run(old, ["-c", _OLD_WORKER, *map(str, jobs["old_worker"])], env, cwd)
    _age(db, jobs["old_worker"])
    _run(old, ["-m", "recon_dagster.cli", "reconcile", "--once"], env, cwd)
    states = _states(db)
    assert {states[j] for j in jobs["done"] + jobs["old_worker"]} == {"completed"}
    assert {states[j] for j in jobs["fail"]} == {"failed"}
    assert {states[j] for j in jobs["slow"]} == {"processing"}  # one attempt, still running

    # Then this release: its worker library and its reconciler.
    _run(sys.executable, ["-c", _OLD_WORKER, *map(str, jobs["new_worker"])], env, cwd)
    _age(db, jobs["new_worker"])
    _run(sys.executable, ["-m", "recon_dagster.cli", "reconcile", "--once"], env, cwd)
    states = _states(db)
    completed = jobs["done"] + jobs["slow"] + jobs["old_worker"] + jobs["new_worker"]
    assert {states[j] for j in completed} == {"completed"}
    assert {states[j] for j in jobs["fail"]} == {"failed"}

    with db.connect() as conn:
        usage = dict(
            conn.execute(
                sa.text("SELECT job_id, string_agg(status, ',') FROM usage_logs GROUP BY job_id")
            ).all()
        )
        assets = dict(conn.execute(sa.text("SELECT job_id, count(*) FROM assets GROUP BY job_id")).all())
        balance = conn.execute(
            sa.text("SELECT subscription_credits FROM user_credits WHERE user_id = :u"), {"u": str(user)}
        ).scalar_one()
        anomalies = conn.execute(sa.text("SELECT reason FROM credit_anomalies")).scalars().all()
    assert {usage[j] for j in completed} == {"committed"}  # one reservation each, settled once
    assert {usage[j] for j in jobs["fail"]} == {"refunded"}
    assert all(assets.get(j) == 1 for j in completed) and not any(assets.get(j) for j in jobs["fail"])
    assert balance == 1000 - CREDITS * len(completed)  # each committed once, each refund returned once
    assert anomalies == []


def _age(db: sa.Engine, job_ids: list[uuid.UUID]) -> None:
    """An hour passes: the rows the dead workers left are stale."""
    sql(
        db,
        "UPDATE jobs SET provider_call_started_at = now() - interval '1 hour' WHERE id = ANY(CAST(:ids AS uuid[]))",
        ids=[str(j) for j in job_ids],
    )


def _states(db: sa.Engine) -> dict[uuid.UUID, str]:
    with db.connect() as conn:
        return {uuid.UUID(str(r.id)): r.status for r in conn.execute(sa.text("SELECT id, status FROM jobs"))}


def test_a_release_refuses_a_schema_that_no_longer_serves_it_with_one_line(
    db: sa.Engine, database_url: str
) -> None:
    """A later migration that an older release cannot run against raises oldest_reader: this
    release then stops at its first connection, before any statement of its own."""
    from recon_dagster.cli.errors import as_cli_error

    sql(db, "INSERT INTO recon_schema_contract (contract, oldest_reader) VALUES (:c, :c)", c=CONTRACT + 1)
    dispose_engines()
    try:
        with pytest.raises(SchemaContractError) as refused, get_engine(database_url).connect():
            pass
        line = str(as_cli_error(refused.value))
        assert "\n" not in line
        assert (
            f"no longer serves this release (contract {CONTRACT}), only contract {CONTRACT + 1} and later"
            in line
        )
        assert "deploy a newer release" in line
        # A schema that still serves it: no refusal.
        _raw(database_url, f"UPDATE recon_schema_contract SET oldest_reader = {CONTRACT}")
        dispose_engines()
        with get_engine(database_url).connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
    finally:
        _raw(database_url, "DELETE FROM recon_schema_contract")
        dispose_engines()


def _raw(database_url: str, statement: str) -> None:
    """Past the engine (which would refuse the schema): one statement on a plain connection."""
    import psycopg

    from recon_dagster.db.engine import libpq_url

    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(statement)
