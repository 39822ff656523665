"""What each group of tests needs, as pytest markers (registered in ``pyproject.toml``).

- ``postgres``: the test uses the session database (``database_url``, ``engine``, ``db`` or
  ``fresh_engine``, directly or through another fixture). Applied by ``recon_dagster_tests/conftest.py``
  at collection: nobody has to remember it.
- ``daemon``: the test starts a real ``dagster-daemon`` (or ``recon-dagster dev``, a code server,
  several processes of its own). Written on the test; a test that starts one without it fails at once
  (``require_marker``, called by the helpers in ``support/daemon.py`` and ``support/topology.py``).
- ``browser``: the test drives headless Chromium. Written on the test, checked the same way.
- ``slow``: outside ``make test-fast``, for what takes seconds per test: a Dagster run executed
  in-process (the ``instance`` fixture), the ``e2e/`` and ``chaos/`` folders (whole processes), and
  the tests marked by hand.

``pytest`` alone runs every group; ``make test-fast`` deselects ``daemon``, ``browser`` and ``slow``.
"""

from __future__ import annotations

import pytest

# A test that asks for one of these needs PostgreSQL.
DATABASE_FIXTURES = frozenset({"database_url", "engine", "db", "fresh_engine"})
# A test that asks for one of these executes Dagster runs in-process: seconds per test.
SLOW_FIXTURES = frozenset({"instance"})
# Folders whose every test starts whole processes.
SLOW_FOLDERS = frozenset({"e2e", "chaos"})

_current: pytest.Item | None = None


def apply(item: pytest.Item) -> None:
    """Add the ``postgres`` and ``slow`` markers a test's fixtures and folder imply."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & DATABASE_FIXTURES:
        item.add_marker(pytest.mark.postgres)
    if fixtures & SLOW_FIXTURES or _folder(item) in SLOW_FOLDERS:
        item.add_marker(pytest.mark.slow)


# The xdist groups (``--dist loadgroup`` in pyproject's addopts): every test of a group runs on one
# worker, one after another. Daemon tests start a daemon, a code server and run workers whose
# ticks and deadlines are measured, browser tests a dev server and Chromium: one of each at a time,
# whatever the worker count. A slow module's tests stay together, so a module-scoped set-up (the
# fault harness's campaign, a browser module's dev server) is paid once, not once per worker.
DAEMON_GROUP = "daemon"
BROWSER_GROUP = "browser"


def group_of(item: pytest.Item) -> str | None:
    """The xdist group ``item`` runs in, or None for a quick test any worker may take."""
    if item.get_closest_marker("daemon"):
        return DAEMON_GROUP
    if item.get_closest_marker("browser"):
        return BROWSER_GROUP
    if item.get_closest_marker("slow"):
        return item.nodeid.split("::", 1)[0]
    return None


def schedule(items: list[pytest.Item]) -> dict[str, str]:
    """Put each test in its group (``group_of``), the groups first: the scheduler
    (``support/scheduling.py``) hands out the groups with the most tests first and then the single
    quick tests, so a pass ends on short tests rather than on a worker alone with a long one.
    Returns each grouped test's group by node id."""
    groups: dict[str, str] = {}
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            groups[item.nodeid] = group
    items.sort(key=lambda item: item.nodeid not in groups)  # stable: each module keeps its order
    return groups


def _folder(item: pytest.Item) -> str:
    parts = item.nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "recon_dagster_tests" else ""


def set_current(item: pytest.Item | None) -> None:
    """The test being set up or run (``conftest.py`` sets it), for ``require_marker``."""
    global _current
    _current = item


def require_marker(*names: str, what: str) -> None:
    """Fail the running test unless it carries one of ``names``: a test that starts a daemon or a
    browser must say so, or ``make test-fast`` would run it."""
    item = _current
    if item is None or any(item.get_closest_marker(n) for n in names):
        return
    marks = " or ".join(f"@pytest.mark.{n}" for n in names)
    pytest.fail(
        f"{item.nodeid} starts {what} but is not marked {marks} (see support/markers.py)", pytrace=False
    )
