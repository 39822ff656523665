"""Waits no live run could have written: a lease or a next-attempt time beyond what one write of
ours sets (now + ``RECON_LEASE_S``, now + the cadence), up to ``infinity``.

Such a row is hidden from the stale scan for as long as the value says (forever at ``infinity``)
with its credits reserved. The sweep clamps it to one lease TTL (or one cadence) from now and
logs an anomaly; when that runs out the row is due, and a lease is taken over like a dead run's
(counting its attempt), so the cap still ends it. A live holder renews its lease before each step,
so a clamp never takes work from it.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from recon_dagster.db import credits

log = logging.getLogger("recon_dagster.reconcile")

# A second of slack: a claim's now() is its own transaction's start, never later than ours.
# ``{scope}``: which rows' kinds may be clamped (see ``_kind_scope``: the enforced ones).
_IMPOSSIBLE = """
  SELECT id, user_id, provider_kind, reconcile_lease_owner, reconcile_attempts,
         reconcile_lease_expires_at > now() + make_interval(secs => :ttl_s + 1) AS lease_bad,
         reconcile_next_at > now() + make_interval(secs => :cadence_s + 1) AS next_bad,
         reconcile_lease_expires_at::text AS lease_was, reconcile_next_at::text AS next_was
  FROM jobs
  WHERE status IN ('pending', 'processing') AND {scope}
    AND (reconcile_lease_expires_at > now() + make_interval(secs => :ttl_s + 1)
         OR reconcile_next_at > now() + make_interval(secs => :cadence_s + 1))
  ORDER BY id
"""
_CLAMP_SQL = f"""
WITH bad AS ({_IMPOSSIBLE}  FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET
  reconcile_lease_expires_at = CASE WHEN bad.lease_bad THEN now() + make_interval(secs => :ttl_s)
                                    ELSE j.reconcile_lease_expires_at END,
  reconcile_next_at = CASE WHEN bad.next_bad THEN now() + make_interval(secs => :cadence_s)
                           ELSE j.reconcile_next_at END
FROM bad WHERE j.id = bad.id
RETURNING j.id, j.user_id, j.provider_kind, j.reconcile_lease_owner, bad.lease_bad, bad.next_bad,
          bad.lease_was, bad.next_was
"""


@dataclass(frozen=True)
class KindScope:
    """Which kinds' rows a clamp may touch, as the modes say (``reconcile.shadow.Modes``): rows of
    a kind in ``enforce`` yes, in ``shadow`` no, any other kind (or none) as ``default``."""

    default: bool = True
    enforce: frozenset[str] = frozenset()
    shadow: frozenset[str] = frozenset()

    def inverse(self) -> KindScope:
        """Every kind this scope leaves out (the shadowed kinds of an enforced scope)."""
        return KindScope(not self.default, self.shadow, self.enforce)

    def sql(self) -> str:
        """The scope as a condition on ``jobs.provider_kind`` (kind names are registry names,
        checked when the modes were read; quoted here all the same)."""

        def names(kinds: frozenset[str]) -> str:
            return ", ".join("'" + k.replace("'", "''") + "'" for k in sorted(kinds)) or "NULL"

        return (
            f"(CASE WHEN provider_kind IN ({names(self.shadow)}) THEN false "
            f"WHEN provider_kind IN ({names(self.enforce)}) THEN true ELSE {str(self.default).lower()} END)"
        )


ALL_KINDS = KindScope()


@dataclass(frozen=True)
class ImpossibleWait:
    """A row whose lease or next attempt lies beyond what one of our writes sets."""

    job_id: uuid.UUID
    provider_kind: str | None
    attempts: int
    reasons: tuple[tuple[str, str], ...]  # (anomaly reason, the value it had)


def impossible_waits(
    conn: sa.Connection, lease_ttl: timedelta, cadence: timedelta, scope: KindScope = ALL_KINDS
) -> list[ImpossibleWait]:
    """The rows ``clamp_impossible_waits`` would clamp in ``scope``, read only (shadow records them)."""
    rows = conn.execute(
        sa.text(_IMPOSSIBLE.format(scope=scope.sql())),
        {"ttl_s": lease_ttl.total_seconds(), "cadence_s": cadence.total_seconds()},
    ).all()
    return [
        ImpossibleWait(uuid.UUID(str(r.id)), r.provider_kind, int(r.reconcile_attempts), tuple(_reasons(r)))
        for r in rows
    ]


def _reasons(r: sa.Row[Any]) -> list[tuple[str, str]]:
    return [
        (reason, was)
        for bad, reason, was in (
            (r.lease_bad, "lease_beyond_ttl", r.lease_was),
            (r.next_bad, "next_attempt_beyond_cadence", r.next_was),
        )
        if bad
    ]


def clamp_impossible_waits(
    engine: sa.Engine, lease_ttl: timedelta, cadence: timedelta, scope: KindScope = ALL_KINDS
) -> int:
    """Clamp impossible leases / next-attempt times of in-flight rows of ``scope``'s kinds (one
    anomaly per job and column); returns how many rows were clamped. Never raises: the sweep goes
    on without it."""
    try:
        with engine.begin() as conn:
            rows = conn.execute(
                sa.text(_CLAMP_SQL.format(scope=scope.sql())),
                {"ttl_s": lease_ttl.total_seconds(), "cadence_s": cadence.total_seconds()},
            ).all()
            for r in rows:
                for reason, was in _reasons(r):
                    log.warning("job %s: %s (%s), clamped", r.id, reason, was)
                    credits.log_credit_anomaly(
                        conn,
                        job_id=uuid.UUID(str(r.id)),
                        user_id=uuid.UUID(str(r.user_id)),
                        reason=reason,
                        details={
                            "was": was,
                            "lease_owner": r.reconcile_lease_owner,
                            "provider_kind": r.provider_kind,
                        },
                    )
        return len(rows)
    except sa.exc.DBAPIError:
        log.exception("could not clamp impossible leases")
        return 0
