"""The operator's commands, run as a newcomer would: the console script in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import dagster as dg

from recon_dagster.db import engine as engine_mod
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.reconcile_support import evaluate_sensor, make_defs


def _cli(
    *args: str, env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recon_dagster.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=300,
    )


def test_migrate_twice_is_a_no_op(engine, database_url):
    out = _cli("migrate", "--database-url", database_url)
    assert out.returncode == 0, out.stderr
    assert "up to date" in out.stdout


def test_status_prints_inflight_and_stale_counts_per_kind(db):
    user = make_user(db)
    make_job(db, user, provider_kind="kie-veo", provider_task_id="t", started_minutes_ago=40)
    make_job(db, user, provider_kind="kie-veo", provider_task_id="u", started_minutes_ago=1)

    out = _cli("status")

    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("kie-veo"))
    assert line.split()[1:3] == ["2", "1"]


def test_reconcile_once_recovers_and_prints_the_tick_summary(db, sandbox, tmp_path):
    user = make_user(db)
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=30)
    reserve(db, job, user, 10)

    out = _cli("reconcile", "--once", env={"RECON_MEDIA_DIR": str(tmp_path)}, cwd=str(tmp_path))

    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(
        r"\[reconcile\] scanned=\d+ recovered=1 failed=0 stillRunning=0 errors=0 \(\d+ms\)", out.stdout
    ), out.stdout
    assert job_row(db, job)["status"] == "completed"
    assert "sandbox-key" not in out.stdout + out.stderr


def test_reconcile_without_once_explains_itself():
    out = _cli("reconcile")
    assert out.returncode == 2
    assert "--once" in out.stderr


def test_unreachable_or_malformed_database_gives_a_clear_one_line_error():
    refused = _cli("status", env={"RECON_DATABASE_URL": "postgresql://root:s3cret@127.0.0.1:1/nope"})
    assert refused.returncode == 1
    assert "database unavailable" in refused.stderr and "port=1" in refused.stderr
    assert "s3cret" not in refused.stderr
    bad = _cli("status", env={"RECON_DATABASE_URL": "mysql://root@127.0.0.1/x"})
    assert bad.returncode == 1
    assert "unsupported database URL scheme 'mysql'" in bad.stderr


def test_sensor_skips_with_a_clear_reason_when_the_database_does_not_answer(monkeypatch, media_dir, sandbox):
    monkeypatch.setenv("RECON_DATABASE_URL", "postgresql://root@127.0.0.1:1/nope")
    engine_mod.dispose_engines()
    try:
        with dg.instance_for_test() as inst:
            result = evaluate_sensor(make_defs(media_dir), inst)
    finally:
        engine_mod.dispose_engines()
    assert result.run_requests == []
    assert "database unavailable" in result.skip_message
