"""What a first day meets (issue 48, item 8): ``--version``, a load error's one line first, a
readable line for an instance configuration that reads an unset ``DAGSTER_POSTGRES_URL``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


def test_version_names_ours_and_dagsters(tmp_path: Path) -> None:
    done = _run([sys.executable, "-m", "recon_dagster.cli", "--version"], dict(os.environ), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"recon-dagster {version('recon_dagster')} (dagster {version('dagster')})"


def test_a_load_error_is_one_line_before_the_traceback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RECON_DATABASE_URL", "RECON_EMBEDDED_POSTGRES")}
    done = _run([sys.executable, "-c", "import recon_dagster.definitions"], env, tmp_path)
    assert done.returncode != 0
    first = done.stderr.splitlines()[0]
    assert first.startswith(
        "recon_dagster: the code location did not load: DatabaseNotConfigured: RECON_DATABASE_URL is not set"
    ), done.stderr[:500]


@pytest.mark.postgres
def test_an_unset_dagster_postgres_url_is_one_readable_line(
    engine, database_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(
        ROOT / "dagster.yaml", home / "dagster.yaml"
    )  # the shipped instance: storage on DAGSTER_POSTGRES_URL
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_POSTGRES_URL"}
    env.update(DAGSTER_HOME=str(home), RECON_DATABASE_URL=database_url)
    done = _run([sys.executable, "-m", "recon_dagster.cli", "reconcile", "--once"], env, tmp_path)
    assert done.returncode == 1
    [line] = [x for x in done.stderr.splitlines() if x.strip()]
    assert line.startswith("recon-dagster reconcile: DAGSTER_POSTGRES_URL is not set"), line
    assert "set DAGSTER_POSTGRES_URL" in line and "Field(" not in line
