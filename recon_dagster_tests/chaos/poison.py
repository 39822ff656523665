"""Poison rows for the fault harness: values a jobs row can hold that Python's datetime
or an int4 increment cannot carry on. ``poison`` marks a quarter of a reconcile round's jobs; the
round's other jobs are their batch-mates, and every one of them must end settled."""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from typing import Protocol

import sqlalchemy as sa


class _Job(Protocol):
    id: uuid.UUID


# A value each poisoned row gets: (column, SQL value). A provider call time in the future is left
# out on purpose: such a row is not stale yet as far as anyone can tell, so it is never due (as at
# +infinity); every other value below must end settled.
POISON_TIMESTAMPS = tuple(
    (c, v)
    for c in ("provider_call_started_at", "created_at", "started_at", "reconcile_next_at", "updated_at")
    for v in ("'0001-01-01 00:00:00+00 BC'", "'10000-01-01 00:00:00+00'", "'infinity'", "'-infinity'")
    if not (c == "provider_call_started_at" and v in ("'10000-01-01 00:00:00+00'", "'infinity'"))
) + tuple(
    ("reconcile_lease_expires_at", v)
    for v in ("'0001-01-01 00:00:00+00 BC'", "'10000-01-01 00:00:00+00'", "'infinity'")
)
POISON_COUNTERS = (2_147_483_647, 2_147_483_646, -1, -2_147_483_648, 10_000)


def poison(engine: sa.Engine, rng: random.Random, jobs: Sequence[_Job], point: str) -> int:
    """Poison a quarter of the jobs (at least one) for a ``POISONS`` round; returns how many."""
    chosen = rng.sample(list(jobs), max(1, len(jobs) // 4))
    with engine.begin() as conn:
        for job in chosen:
            if point == "poison.timestamp":
                column, value = rng.choice(POISON_TIMESTAMPS)
                owner = (
                    ", reconcile_lease_owner = 'poisoned-run'"
                    if column == "reconcile_lease_expires_at"
                    else ""
                )
                conn.execute(
                    sa.text(f"UPDATE jobs SET {column} = {value}{owner} WHERE id = :j"), {"j": str(job.id)}
                )
            else:
                # Half of them also carry a dead run's lease: the takeover path counts too.
                lease = rng.random() < 0.5
                conn.execute(
                    sa.text(
                        "UPDATE jobs SET reconcile_attempts = :n, "
                        "reconcile_lease_owner = CASE WHEN :lease THEN 'dead-run' END, "
                        "reconcile_lease_expires_at = CASE WHEN :lease THEN now() - interval '1 second' END "
                        "WHERE id = :j"
                    ),
                    {"n": rng.choice(POISON_COUNTERS), "lease": lease, "j": str(job.id)},
                )
    return len(chosen)
