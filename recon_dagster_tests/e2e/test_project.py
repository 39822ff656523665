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

ROOT = Path(__file__).resolve().parents[2]
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

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = [
        *project["dependencies"],
        *(d for extra in project["optional-dependencies"].values() for d in extra),
    ]
    pins = dict(re.match(r"([\w-]+)==(\S+)", d).groups() for d in deps if "==" in d)  # type: ignore[union-attr]
    assert pins["dagster-dg-cli"] == pins["dagster"]


# --- the README and docs/ stand on their own ---------------------------------------------------------

DOCS = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A backticked path into the repository: starts at one of its top-level folders.
_PATH = re.compile(r"`((?:recon_dagster|recon_dagster_tests|migrations|benchmarks|docs|\.ci)/[\w./*-]*)`")


def test_docs_exist_and_never_point_outside_the_repository():
    assert (ROOT / "docs" / "design.md").is_file()
    for doc in [*DOCS, ROOT / "pyproject.toml"]:
        text = doc.read_text()
        for outside in ("shared/", "../shared", "issue notes", "dagster-notes"):
            assert outside not in text.replace("dagster_shared", ""), (doc.name, outside)


def test_every_relative_link_and_referenced_path_resolves():
    checked = 0
    for doc in DOCS:
        text = doc.read_text()
        for target in _LINK.findall(text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path).resolve() if path else doc
            assert resolved.exists(), f"{doc.name}: link {target} -> {resolved} does not exist"
            if anchor and resolved.suffix == ".md":
                headings = {
                    re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-")
                    for h in re.findall(r"^#+ (.+)$", resolved.read_text(), re.M)
                }
                assert anchor in headings, f"{doc.name}: anchor #{anchor} not in {resolved.name}"
            checked += 1
        for ref in _PATH.findall(text):
            assert list(ROOT.glob(ref.rstrip("/") + "*")), f"{doc.name}: `{ref}` does not exist"
            checked += 1
    assert checked >= 10


def test_the_readme_opens_with_the_two_setup_commands():
    first = (ROOT / "README.md").read_text().splitlines()[:4]
    assert first[0] == "```sh"
    assert first[1].endswith(".venv/bin/recon-dagster demo") and first[2].endswith(".venv/bin/pytest")


def test_one_version_everywhere_and_in_the_changelog():
    """The version a release carries is pyproject's; the package, the Helm values' image tag and
    the changelog's newest release say the same."""
    import tomllib

    import recon_dagster

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert recon_dagster.__version__ == version
    assert f'tag: "{version}"' in (ROOT / "deploy" / "helm" / "values.yaml").read_text()
    releases = re.findall(r"^## \[(\d[^\]]*)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases and releases[0] == version, releases[:2]
