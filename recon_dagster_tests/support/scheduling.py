"""How the suite's tests are dealt to pytest-xdist's workers (``--dist loadgroup`` in pyproject's
addopts): the groups of ``markers.group_of`` each go to one worker whole, the rest one test at a
time, the biggest groups first.

pytest-xdist 3.8 reads a test's ``xdist_group`` by appending it to the test's node id, which
pytest 9 no longer reads (its node id is a structured value): the controller saw no group, and
every group was dealt out test by test. So the workers write down each test's group as they
collect (``record``), and the controller's scheduler reads it (``GroupScheduling``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

# The folder the controller makes for the workers' group files; inherited by the workers.
GROUPS_DIR_ENV = "RECON_TEST_GROUPS_DIR"


def is_controller(config: pytest.Config) -> bool:
    """This process hands out tests to xdist workers (not a worker, not ``-n 0``)."""
    return not hasattr(config, "workerinput") and config.getvalue("dist") not in (None, "no")


def prepare(config: pytest.Config) -> None:
    """In the controller, before the workers start: a fresh folder for their group files."""
    if is_controller(config):
        os.environ[GROUPS_DIR_ENV] = tempfile.mkdtemp(prefix="recon-test-groups-")


def finish(config: pytest.Config) -> None:
    """In the controller, at the end: the group files go."""
    folder = os.environ.get(GROUPS_DIR_ENV)
    if is_controller(config) and folder:
        shutil.rmtree(folder, ignore_errors=True)


def record(config: pytest.Config, groups: dict[str, str]) -> None:
    """In a worker: each collected test's group, by node id, where the controller will read it."""
    folder = os.environ.get(GROUPS_DIR_ENV)
    worker = getattr(config, "workerinput", {}).get("workerid")
    if not folder or worker is None:
        return
    path = Path(folder) / f"{worker}.json"
    part = path.with_suffix(".part")
    part.write_text(json.dumps(groups))
    part.replace(path)  # whole or not at all: the controller reads it once every worker collected


class GroupScheduling(LoadScopeScheduling):
    """LoadScope with the workers' groups as scopes; a test of no group is a scope of its own."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            self._groups = _read_groups()
        return self._groups.get(nodeid, nodeid)


def _read_groups() -> dict[str, str]:
    folder = os.environ.get(GROUPS_DIR_ENV)
    if not folder:
        return {}
    files = sorted(Path(folder).glob("*.json"))
    # Every worker collected the same tests (xdist checks it before scheduling): one file is enough.
    return json.loads(files[0].read_text()) if files else {}
