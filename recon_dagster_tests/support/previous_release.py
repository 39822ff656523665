"""The previous release, built from its release commit in this repository's history into a venv of
its own, for the rolling-upgrade test.

Cheap and still the release's own code: ``git archive`` of the commit, a venv without pip whose
only extra path is this venv's site-packages (0.2.0's runtime dependencies are this release's, a
test checks it; a ``.pth`` path entry is not a site dir, so this venv's editable ``recon_dagster``
finder is not loaded there), and ``pip install --no-deps --no-build-isolation --no-index`` of the
archive into it (a real wheel build and install, ~10 s on the shared 2-core machine). The old
package is then imported from that venv's own site-packages, ahead of anything else.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

RELEASE = "0.2.0"
COMMIT = "8824449"  # "0.2.0: the version in pyproject, ..." (CHANGELOG names it)
FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "recon_dagster", "migrations")


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def has_commit(commit: str = COMMIT) -> bool:
    done = subprocess.run(
        ["git", "-C", str(repo_root()), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    return done.returncode == 0


def runtime_dependencies(pyproject: str) -> list[str]:
    return sorted(tomllib.loads(pyproject)["project"]["dependencies"])


def release_pyproject(commit: str = COMMIT) -> str:
    return subprocess.run(
        ["git", "-C", str(repo_root()), "show", f"{commit}:pyproject.toml"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def build(into: Path, commit: str = COMMIT) -> Path:
    """The previous release installed in a venv under ``into``; returns its python."""
    src = into / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(repo_root()), "archive", commit, *FILES], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    venv = into / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(purelib, "_recon_shared_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-build-isolation", "--no-index", str(src)],
        check=True, capture_output=True, cwd=into,
    )  # fmt: skip
    return python
