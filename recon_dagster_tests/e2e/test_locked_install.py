"""The VM's locked install, as docs/deploying.md writes it (issue 48): the block's own lines, run
in a fresh venv from a copy of the checkout, install the webserver's extra from ``uv.lock`` with
hashes and the pip ``deploy/pip.txt`` names; what ends up installed is the lock's versions, and
the Dockerfile installs the same pip by the same hash.

The venv's own pip (``python3.11 -m venv``: 23.x on this interpreter and on Debian 12) refuses the
lock in ``--require-hashes`` mode; the documented block upgrades it first.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from recon_dagster.core.paths import project_root

ROOT = project_root() or Path(__file__).resolve().parents[2]
MARK = "<!-- vm-locked-install -->"
# What a checkout of the release's tag has that the install reads (the Dockerfile's COPY list).
CHECKOUT = (
    "pyproject.toml",
    "uv.lock",
    "setup.py",
    "MANIFEST.in",
    "README.md",
    "recon_dagster",
    "migrations",
    "deploy",
)


def documented_lines() -> list[str]:
    text = (ROOT / "docs" / "deploying.md").read_text()
    block = text.split(MARK, 1)[1]
    body = re.search(r"```sh\n(.*?)```", block, re.S)
    assert body is not None, f"no sh block after {MARK}"
    return [line for line in body.group(1).splitlines() if line.strip()]


def _pip_pins() -> dict[str, tuple[str, set[str]]]:
    """deploy/pip.txt: name -> (version, hashes)."""
    pins: dict[str, tuple[str, set[str]]] = {}
    name = ""
    for line in (ROOT / "deploy" / "pip.txt").read_text().splitlines():
        found = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line)
        if found:
            name = canonicalize_name(found.group(1))
            pins[name] = (found.group(2), set())
        for digest in re.findall(r"--hash=(sha256:[0-9a-f]{64})", line):
            pins[name][1].add(digest)
    return pins


def test_the_installers_tools_are_the_locks_and_the_dockerfiles_pip_is_deploy_pip_txts() -> None:
    lock = {canonicalize_name(p["name"]): p for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    pins = _pip_pins()
    assert set(pins) == {"pip", "uv", "setuptools"}
    for tool in ("uv", "setuptools"):
        version, hashes = pins[tool]
        assert version == lock[tool]["version"]
        assert hashes == {w["hash"] for w in lock[tool]["wheels"]}, tool
    version, hashes = pins["pip"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    [(docker_version, docker_hash)] = re.findall(r"pip==(\S+) --hash=(sha256:[0-9a-f]{64})", dockerfile)
    assert (docker_version, {docker_hash}) == (version, hashes)
    lines = documented_lines()
    assert "--require-hashes --only-binary=:all: -r deploy/pip.txt" in lines[1]
    assert any("--require-hashes --only-binary=:all: -r .venv/requirements.txt" in line for line in lines)


@pytest.mark.slow
def test_the_documented_vm_install_installs_the_webserver_from_the_lock_with_hashes(tmp_path: Path) -> None:
    checkout = tmp_path / "recon_dagster"
    checkout.mkdir()
    for name in CHECKOUT:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(
                source, checkout / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(source, checkout / name)
    python = Path(sys.executable).resolve()
    script = "set -eux\n" + "\n".join(
        line.replace("python3.11 -m venv", f"{python} -m venv") for line in documented_lines()
    )
    done = subprocess.run(["bash", "-c", script], cwd=checkout, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    venv = checkout / ".venv" / "bin"
    assert "pip 24.0 " in subprocess.run([venv / "pip", "--version"], capture_output=True, text=True).stdout
    web = subprocess.run(
        [venv / "dagster-webserver", "--version"], capture_output=True, text=True, timeout=120
    )
    assert web.returncode == 0, web.stderr
    # Every locked package exported for the extra is installed at the lock's version.
    requirements = (checkout / ".venv" / "requirements.txt").read_text()
    exported = {}
    for line in re.findall(r"^[A-Za-z0-9_.-]+==.*?(?= \\$|$)", requirements, re.M):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():  # colorama, psutil: Windows only
            exported[canonicalize_name(req.name)] = str(req.specifier).removeprefix("==")
    assert "dagster-webserver" in exported
    assert all("--hash=sha256:" in block for block in re.split(r"\n(?=[A-Za-z0-9_.-]+==)", requirements)[1:])
    freeze = subprocess.run([venv / "pip", "freeze", "--all"], capture_output=True, text=True).stdout
    installed = {canonicalize_name(n): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", freeze, re.M)}
    assert {n: installed.get(n) for n in exported} == exported
