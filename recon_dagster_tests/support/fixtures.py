"""Fixtures shared by several test modules (``recon_dagster_tests/conftest.py`` imports them, so
every test can ask for them by name; a module's own fixture of the same name takes precedence)."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from recon_dagster_tests.support.factories import make_user


@pytest.fixture
def user(db: sa.Engine) -> uuid.UUID:
    """A user with 100 subscription and 50 top-up credits in this test's emptied database."""
    return make_user(db)
