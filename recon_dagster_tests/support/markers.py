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
