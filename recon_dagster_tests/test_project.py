"""The checkout as a newcomer meets it: Dagster's `dg` CLI loads the code location, and the README
and docs/ point only at things that exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DG = Path(sys.executable).with_name("dg")


def _dg(*args: str, home: Path) -> subprocess.CompletedProcess:
    # A DAGSTER_HOME of its own: the checkout's ./dagster.yaml needs DAGSTER_POSTGRES_URL.
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    return subprocess.run(
        [str(DG if DG.exists() else shutil.which("dg")), *args],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip


@pytest.fixture
def dagster_home(tmp_path: Path) -> Path:
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return tmp_path


def test_dg_check_defs_and_list_defs_load_the_code_location(dagster_home):
    check = _dg("check", "defs", home=dagster_home)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    listed = _dg("list", "defs", "--json", home=dagster_home)
    assert listed.returncode == 0, listed.stderr[-2000:]
    for name in ("stale_inflight_jobs_sensor", "reconcile_job", "sync_sweep_job", "inflight_backlog"):
        assert name in listed.stdout, name


def test_dg_cli_is_pinned_to_the_dagster_line():
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = dict(re.match(r"([\w-]+)==(\S+)", d).groups() for d in deps if "==" in d)  # type: ignore[union-attr]
    assert pins["dagster-dg-cli"] == pins["dagster"]
