"""The two-role recipe (``deploy/roles.sql``) on a real database (issue 48, item 3).

The owner runs ``migrate`` (``RECON_MIGRATE_DATABASE_URL``) and owns the app's tables; the runtime
role, granted before migrate created recon_dagster's tables, reads and writes them through the
owner's default privileges and reconciles a job with nothing more. A runtime role missing a grant
stops at start with one line naming the GRANT to run.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from recon_dagster.db.engine import parse_url
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.db.app_shaped import create_app_tables
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

RECIPE = Path(__file__).parents[2] / "deploy" / "roles.sql"


def _url(database_url: str, user: str, database: str) -> str:
    return (
        parse_url(database_url)
        .set(username=user, password=None, database=database)
        .render_as_string(hide_password=False)
    )


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RECON_MIGRATE_", "DAGSTER_HOME"))}
    return subprocess.run(
        [sys.executable, "-m", "recon_dagster.cli", *args],
        env={**base, **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture
def two_roles(engine: sa.Engine, database_url: str) -> Iterator[dict[str, str]]:
    suffix = secrets.token_hex(4)
    owner, runtime, name = f"recon_owner_{suffix}", f"recon_runtime_{suffix}", f"recon_roles_{suffix}"
    admin = engine.execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE ROLE "{owner}" LOGIN')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}" OWNER "{owner}"')
    urls = {
        "owner": _url(database_url, owner, name),
        "runtime": _url(database_url, runtime, name),
        "admin": _url(database_url, parse_url(database_url).username or "postgres", name),
        "runtime_role": runtime,
    }
    try:
        yield urls
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'DROP ROLE IF EXISTS "{runtime}"')
            conn.exec_driver_sql(f'DROP ROLE IF EXISTS "{owner}"')


def _run_recipe(admin_url: str, owner: str, runtime: str) -> None:
    text = RECIPE.read_text().replace("recon_owner", owner).replace("recon_runtime", runtime)
    eng = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as conn:
            conn.connection.driver_connection.execute(text.encode())  # bytes: no placeholders
    finally:
        eng.dispose()


def test_the_two_role_recipe_reconciles_as_the_runtime_role(two_roles, sandbox, tmp_path: Path) -> None:
    owner_engine = sa.create_engine(two_roles["owner"])
    try:
        create_app_tables(owner_engine)  # the app's tables, owned by the app's owner role
        owner = parse_url(two_roles["owner"]).username or ""
        _run_recipe(two_roles["admin"], owner, two_roles["runtime_role"])  # before migrate

        migrated = _cli(
            "migrate", RECON_DATABASE_URL=two_roles["runtime"], RECON_MIGRATE_DATABASE_URL=two_roles["owner"]
        )
        assert migrated.returncode == 0, migrated.stderr
        # The runtime role: status passes the start-up check, and a reconcile pass settles a job.
        assert _cli("status", RECON_DATABASE_URL=two_roles["runtime"]).returncode == 0
        user = make_user(owner_engine)
        task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
        job = make_job(
            owner_engine, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=60
        )
        reserve(owner_engine, job, user, 5)
        once = _cli(
            "reconcile", "--once",
            RECON_DATABASE_URL=two_roles["runtime"], RECON_MEDIA_DIR=str(tmp_path / "media"), **sandbox.env(),
        )  # fmt: skip
        assert once.returncode == 0, once.stdout[-2000:] + once.stderr[-2000:]
        assert re.search(r"recovered=1\b", once.stdout), once.stdout
        assert job_row(owner_engine, job)["status"] == "completed"

        # Without one grant: one line naming it, at start.
        with owner_engine.begin() as conn:
            conn.exec_driver_sql(f'REVOKE INSERT ON reconcile_events FROM "{two_roles["runtime_role"]}"')
        refused = _cli("status", RECON_DATABASE_URL=two_roles["runtime"])
        assert refused.returncode == 1
        [line] = [x for x in refused.stderr.splitlines() if x.strip()]
        assert line.startswith(
            f"recon-dagster status: role {two_roles['runtime_role']} lacks INSERT on reconcile_events"
        )
        assert f"GRANT INSERT ON reconcile_events TO {two_roles['runtime_role']}" in line
    finally:
        owner_engine.dispose()
