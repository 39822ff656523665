"""Telemetry's commit and rollback hooks (``instruments.install_commit_hooks``) listen to every engine
of the process, once telemetry started in it, and stay. A connection invalidated inside its block
(the server gone, or closed on purpose as migrate's session is) must still close cleanly: the
rollback hook read the connection's info, which tried to reconnect and raised
``PendingRollbackError`` in place of what happened, so every later ``migrate`` of that process
failed."""

from __future__ import annotations

import sqlalchemy as sa

from recon_dagster.db.migrate import migrate
from recon_dagster.telemetry import instruments


def test_migrate_works_in_a_process_whose_telemetry_hooks_are_installed(fresh_engine: sa.Engine) -> None:
    instruments.install_commit_hooks()
    assert migrate(fresh_engine)  # its session invalidates its connection when done
    with fresh_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM recon_schema_migrations")).scalar_one() > 0


def test_a_connection_invalidated_mid_transaction_closes_without_a_hook_error(engine: sa.Engine) -> None:
    instruments.install_commit_hooks()
    with engine.connect() as conn:
        conn.begin()
        conn.execute(sa.text("SELECT 1"))
        conn.invalidate()
    with engine.connect() as conn:  # the pool gives a working connection again
        assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
