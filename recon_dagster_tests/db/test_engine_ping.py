"""Pooled connections are pinged when they sat idle, not at every checkout, and a connection the
server dropped while idle is replaced before anyone uses it (real PostgreSQL)."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from recon_dagster.db import engine as engine_mod
from recon_dagster.db.engine import _create_engine


@pytest.fixture
def counted(database_url: str, monkeypatch: pytest.MonkeyPatch):
    """A fresh engine whose pings are counted."""
    engine = _create_engine(database_url)
    pings = []
    real = engine.dialect.do_ping
    monkeypatch.setattr(engine.dialect, "do_ping", lambda c: pings.append(1) or real(c))
    try:
        yield engine, pings
    finally:
        engine.dispose()


def _backend_pid(engine: sa.Engine) -> int:
    with engine.begin() as conn:
        return conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()


def test_a_connection_returned_a_moment_ago_is_not_pinged(counted) -> None:
    engine, pings = counted
    pids = {_backend_pid(engine) for _ in range(20)}
    assert len(pids) == 1  # the same pooled connection every time
    assert pings == []  # before: one ping per checkout (20)


def test_a_connection_idle_past_the_threshold_is_pinged_once(counted, monkeypatch) -> None:
    engine, pings = counted
    monkeypatch.setattr(engine_mod, "PING_AFTER_IDLE_S", 0.2)
    first = _backend_pid(engine)
    time.sleep(0.3)
    assert _backend_pid(engine) == first
    assert len(pings) == 1
    assert _backend_pid(engine) == first  # used a moment ago: not pinged again
    assert len(pings) == 1


def test_a_connection_the_server_dropped_while_idle_is_replaced(counted, database_url, monkeypatch) -> None:
    engine, pings = counted
    monkeypatch.setattr(engine_mod, "PING_AFTER_IDLE_S", 0.2)
    dropped = _backend_pid(engine)
    admin = _create_engine(database_url)
    try:
        with admin.begin() as conn:
            assert conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": dropped}).scalar_one()
    finally:
        admin.dispose()
    time.sleep(0.3)
    replacement = _backend_pid(engine)  # no error: the failed ping made the pool open a new one
    assert replacement != dropped
    assert len(pings) == 1
