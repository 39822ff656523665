"""Each test says what it needs: the ``postgres`` and ``slow`` markers follow from its fixtures and
folder, and a test that starts a daemon or a browser without its marker cannot pass, so
``make test-fast`` never runs one by accident (``support/markers.py``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from recon_dagster_tests.support import markers

TESTS = Path(__file__).resolve().parent
# What starts a daemon (or `recon-dagster dev`, a code server, a webserver) or a browser.
STARTERS = {
    "daemon": re.compile(r"\b(daemon_process|code_server_process|webserver_process)\("),
    "browser": re.compile(r"\b(open_console|dagster_dev_process)\("),
}


@dataclass
class _Item:
    """What ``markers.apply`` and ``require_marker`` read of a pytest item."""

    nodeid: str
    fixturenames: list[str]
    marks: list[Any] = field(default_factory=list)

    def add_marker(self, mark: Any) -> None:
        self.marks.append(mark)

    def get_closest_marker(self, name: str) -> Any:
        return next((m for m in self.marks if m.name == name), None)

    @property
    def names(self) -> set[str]:
        return {m.name for m in self.marks}


@pytest.mark.parametrize(
    ("nodeid", "fixtures", "expected"),
    [
        ("recon_dagster_tests/db/test_x.py::test_a", ["db"], {"postgres"}),
        ("recon_dagster_tests/db/test_x.py::test_a", ["request", "fresh_engine"], {"postgres"}),
        ("recon_dagster_tests/defs/test_x.py::test_a", ["engine", "instance"], {"postgres", "slow"}),
        ("recon_dagster_tests/e2e/test_x.py::test_a", ["tmp_path"], {"slow"}),
        ("recon_dagster_tests/chaos/test_x.py::test_a", ["database_url"], {"postgres", "slow"}),
        ("recon_dagster_tests/core/test_x.py::test_a", ["tmp_path", "monkeypatch"], set()),
    ],
)
def test_the_markers_follow_from_fixtures_and_folder(
    nodeid: str, fixtures: list[str], expected: set[str]
) -> None:
    item = _Item(nodeid, fixtures)
    markers.apply(item)  # type: ignore[arg-type]
    assert item.names == expected


def test_this_run_marked_a_database_test_postgres(request: pytest.FixtureRequest) -> None:
    # The hook ran on this very session: a test asking for no database fixture is not postgres.
    assert request.node.get_closest_marker("postgres") is None
    assert "db" not in request.fixturenames


def test_starting_a_daemon_without_the_marker_fails_the_test(request: pytest.FixtureRequest) -> None:
    markers.set_current(_Item("recon_dagster_tests/defs/test_x.py::test_a", []))  # type: ignore[arg-type]
    try:
        with pytest.raises(pytest.fail.Exception, match=r"starts a dagster-daemon but is not marked"):
            markers.require_marker("daemon", what="a dagster-daemon")
        marked = _Item("recon_dagster_tests/defs/test_x.py::test_a", [], [pytest.mark.daemon.mark])
        markers.set_current(marked)  # type: ignore[arg-type]
        markers.require_marker("daemon", what="a dagster-daemon")
    finally:
        markers.set_current(request.node)


@pytest.mark.parametrize("marker", sorted(STARTERS))
def test_every_module_that_starts_a_daemon_or_a_browser_carries_its_marker(marker: str) -> None:
    """A static check beside the run-time one: it also covers tests that do not run here (a
    missing browser skips them)."""
    unmarked = []
    for path in sorted(TESTS.rglob("test_*.py")):
        text = path.read_text()
        if path.name == Path(__file__).name or not STARTERS[marker].search(text):
            continue
        if f"pytest.mark.{marker}" not in text:
            unmarked.append(str(path.relative_to(TESTS)))
    assert unmarked == []


@pytest.mark.parametrize(
    ("nodeid", "marks", "expected"),
    [
        ("recon_dagster_tests/e2e/test_x.py::test_a", ["daemon", "slow"], markers.DAEMON_GROUP),
        ("recon_dagster_tests/defs/test_x.py::test_a", ["daemon"], markers.DAEMON_GROUP),
        ("recon_dagster_tests/e2e/test_y.py::test_b", ["browser", "slow"], markers.BROWSER_GROUP),
        ("recon_dagster_tests/chaos/test_x.py::test_a[p]", ["slow"], "recon_dagster_tests/chaos/test_x.py"),
        ("recon_dagster_tests/db/test_x.py::test_a", ["postgres"], None),
    ],
)
def test_daemon_and_browser_tests_share_a_group_and_a_slow_module_keeps_together(
    nodeid: str, marks: list[str], expected: str | None
) -> None:
    item = _Item(nodeid, [], [getattr(pytest.mark, m).mark for m in marks])
    assert markers.group_of(item) == expected  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_workers_get_a_group_whole_and_quick_tests_one_by_one(tmp_path: Path) -> None:
    """Through real pytest-xdist workers, as a pass deals them: a slow module's tests all on one
    worker (its module set-up paid once), quick tests spread over several. pytest-xdist's own
    ``xdist_group`` never reached its controller under pytest 9 (``support/scheduling.py``)."""
    import subprocess
    import sys

    slow_module = "recon_dagster_tests/e2e/test_k8s_manifests.py"
    quick_module = "recon_dagster_tests/core/test_house.py"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "-v", "-p", "no:cacheprovider", slow_module, quick_module],
        cwd=TESTS.parent, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    for line in done.stdout.splitlines():
        found = re.match(r"\[(gw\d+)\] .*?PASSED (\S+?)::", line)
        if found:
            workers.setdefault(found.group(2), set()).add(found.group(1))
    assert len(workers[slow_module]) == 1, workers
    assert len(workers[quick_module]) > 1, workers
