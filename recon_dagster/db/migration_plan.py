"""``recon-dagster migrate --plan``: what ``migrate`` would do, statement by statement, writing nothing.

For each pending migration: how it runs (one transaction, statement by statement, or the baseline's
check), and for each statement the lock it takes on which table, for how long the app can be held
up by it, and whether it would run, be skipped (already there) or rebuild an INVALID index. The
session is read-only (``default_transaction_read_only``), and nothing is created, not even the
bookkeeping table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg
import sqlalchemy as sa

from recon_dagster.db import baseline
from recon_dagster.db.migrate import (
    BASELINE_VERSION,
    DEFAULT_LOCK_TIMEOUT,
    Migration,
    applied_versions,
    check_drift,
    discover,
    index_state,
    migration_session,
    reset_session,
    skip_reason,
)
from recon_dagster.db.migration_sql import SHARE_UPDATE_EXCLUSIVE, Lock, Statement


@dataclass(frozen=True)
class PlannedStatement:
    line: int
    text: str
    locks: tuple[str, ...]
    action: str


@dataclass
class PlannedMigration:
    name: str
    how: str
    statements: list[PlannedStatement] = field(default_factory=list)
    app_tables: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)


def describe_lock(lock: Lock, lock_timeout: str, created_here: frozenset[str]) -> str:
    if lock.new or lock.table in created_here:
        return f"{lock.mode} on {lock.table} (created by this migration: nobody else uses it)"
    if lock.table.startswith("index "):
        return f"{lock.mode} on the table of {lock.table[6:]}"
    owner = "the app's" if lock.app_table else "recon_dagster's"
    if lock.mode == SHARE_UPDATE_EXCLUSIVE:
        return (
            f"{lock.mode} on {lock.table} ({owner}) for the whole build: its reads and writes go on; "
            f"each wait for an older transaction <= lock_timeout {lock_timeout}"
        )
    if lock.blocks_app_writes:
        return (
            f"{lock.mode} on {lock.table} ({owner}): the app's writes to {lock.table} queue for "
            f"<= lock_timeout {lock_timeout} while it waits (retried with backoff), then a catalog change"
        )
    return f"{lock.mode} on {lock.table} ({owner}) <= lock_timeout {lock_timeout}"


def _action(pg: psycopg.Connection, st: Statement, transactional: bool) -> str:
    if st.setting is not None:
        return "session setting"
    reason = skip_reason(pg, st)
    if reason:
        return f"skip: {reason} (no lock taken)"
    if (index := st.index) and index_state(pg, *index) == "invalid":
        return f"rebuild: index {index[0]} is INVALID (an interrupted build): drop CONCURRENTLY, build again"
    return "run (in the file's transaction)" if transactional else "run"


def plan(engine: sa.Engine, migrations: list[Migration] | None = None) -> list[PlannedMigration]:
    """The pending migrations and what each statement would do and lock; writes nothing."""
    migrations = discover() if migrations is None else sorted(migrations, key=lambda m: m.version)
    out: list[PlannedMigration] = []
    with migration_session(engine) as pg:
        reset_session(pg)
        pg.execute("SET default_transaction_read_only = on")
        applied = applied_versions(pg) or {}
        check_drift(migrations, applied)
        for m in migrations:
            if m.version in applied:
                continue
            if m.version == BASELINE_VERSION and (present := baseline.present_app_tables(pg)):
                gaps = baseline.gaps(pg, baseline.expected_tables(m.statements))
                out.append(
                    PlannedMigration(
                        m.name,
                        f"check only: the app's tables exist ({', '.join(present)}); nothing of them is changed",
                        gaps=gaps,
                    )
                )
                continue
            how = "one transaction" if m.transactional else "statement by statement, each its own transaction"
            if m.version == BASELINE_VERSION:
                how += ": creates the app's tables (this database has none of them)"
            planned = PlannedMigration(m.name, how)
            lock_timeout = DEFAULT_LOCK_TIMEOUT
            app: set[str] = set()
            for st in m.statements:
                if (setting := st.setting) and setting[0] == "lock_timeout":
                    lock_timeout = setting[1] if setting[1] is not None else DEFAULT_LOCK_TIMEOUT
                    lock_timeout = "0 (no limit)" if lock_timeout == "0" else lock_timeout
                locks = tuple(describe_lock(lock, lock_timeout, m.created_tables) for lock in st.locks)
                app.update(
                    lock.table for lock in st.locks if lock.app_table and lock.table not in m.created_tables
                )
                planned.statements.append(
                    PlannedStatement(st.line, st.first_line, locks, _action(pg, st, m.transactional))
                )
            planned.app_tables = sorted(app)
            out.append(planned)
    return out


def render(planned: list[PlannedMigration], where: str) -> str:
    if not planned:
        return f"migrate --plan: {where} is up to date; nothing would run"
    lines = [f"migrate --plan: {len(planned)} pending migration(s) on {where}; nothing was written"]
    for m in planned:
        lines.append("")
        lines.append(f"{m.name}: {m.how}")
        for st in m.statements:
            lines.append(f"  line {st.line}: {st.text}")
            lines.extend(f"    lock: {lock}" for lock in st.locks)
            lines.append(f"    -> {st.action}")
        if m.gaps:
            lines.append(f"  {len(m.gaps)} gap(s): migrate would stop here and change nothing")
            lines.extend(f"  gap: {g}" for g in m.gaps)
        elif m.how.startswith("check only"):
            lines.append("  no gap: every table and column recon_dagster reads is there")
        lines.append(f"  app tables touched: {', '.join(m.app_tables) or 'none'}")
    return "\n".join(lines)


__all__ = ["PlannedMigration", "PlannedStatement", "plan", "render"]
