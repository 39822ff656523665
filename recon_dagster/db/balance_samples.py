"""A provider's balance as spend reconciliation sampled it (``recon_balance_samples``, migration 151).

A provider without per-task billing (KIE) is judged by the change of its balance between two
samples. Each sample names the one its window starts at, and a sample starts at most one window:
``record`` is a compare-and-set on the chain's head, so of two runs that read the same latest
sample only one extends the chain; the other is told so (None) and must measure again from the
sample that won, never count the same window a second time.

The chain is pruned from its old end by ``prune_history`` (``db/retention.py``): never its head,
a sample of a spend day not final yet or the sample such a one measures from; the oldest sample
kept becomes the chain's first (``previous_id`` NULL).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from recon_dagster.db.sqltext import sql

TABLE = "recon_balance_samples"


@dataclass(frozen=True)
class Sample:
    id: int
    balance: float
    sampled_at: datetime


_LATEST = sql(f"SELECT id, balance, sampled_at FROM {TABLE} WHERE provider = :p ORDER BY id DESC LIMIT 1")

# The unique index on (provider, COALESCE(previous_id, 0)) is the guard: a second sample from the
# same previous one (or a second first one) inserts nothing and returns no row.
_RECORD = sql(
    f"""
    INSERT INTO {TABLE} (provider, balance, sampled_at, previous_id, run_id, partition)
    VALUES (:p, :balance, :at, :previous, :run_id, :partition)
    ON CONFLICT DO NOTHING
    RETURNING id
    """
)


def latest(conn: sa.Connection, provider: str) -> Sample | None:
    """The head of ``provider``'s chain: the sample no later one has measured from yet."""
    row = conn.execute(_LATEST, {"p": provider}).one_or_none()
    return None if row is None else Sample(int(row.id), float(row.balance), row.sampled_at)


def record(
    conn: sa.Connection,
    provider: str,
    balance: float,
    sampled_at: datetime,
    previous: Sample | None,
    *,
    run_id: str = "",
    partition: str = "",
) -> Sample | None:
    """Add a sample whose window starts at ``previous`` (None: the provider's first); None when
    another sample already starts there (another run won; nothing was written)."""
    row = conn.execute(
        _RECORD,
        {
            "p": provider,
            "balance": balance,
            "at": sampled_at,
            "previous": None if previous is None else previous.id,
            "run_id": run_id,
            "partition": partition,
        },
    ).one_or_none()
    return None if row is None else Sample(int(row.id), balance, sampled_at)


__all__ = ["TABLE", "Sample", "latest", "record"]
