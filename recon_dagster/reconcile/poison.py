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
from datetime import timedelta

import sqlalchemy as sa

from recon_dagster.db import credits

log = logging.getLogger("recon_dagster.reconcile")

# A second of slack: a claim's now() is its own transaction's start, never later than ours.
_CLAMP_SQL = """
WITH bad AS (
  SELECT id,
         reconcile_lease_expires_at > now() + make_interval(secs => :ttl_s + 1) AS lease_bad,
         reconcile_next_at > now() + make_interval(secs => :cadence_s + 1) AS next_bad,
         reconcile_lease_expires_at::text AS lease_was, reconcile_next_at::text AS next_was
  FROM jobs
  WHERE status IN ('pending', 'processing')
    AND (reconcile_lease_expires_at > now() + make_interval(secs => :ttl_s + 1)
         OR reconcile_next_at > now() + make_interval(secs => :cadence_s + 1))
  ORDER BY id
  FOR UPDATE SKIP LOCKED
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


def clamp_impossible_waits(engine: sa.Engine, lease_ttl: timedelta, cadence: timedelta) -> int:
    """Clamp impossible leases / next-attempt times of in-flight rows (one anomaly per job and
    column); returns how many rows were clamped. Never raises: the sweep goes on without it."""
    try:
        with engine.begin() as conn:
            rows = conn.execute(
                sa.text(_CLAMP_SQL),
                {"ttl_s": lease_ttl.total_seconds(), "cadence_s": cadence.total_seconds()},
            ).all()
            for r in rows:
                for bad, reason, was in (
                    (r.lease_bad, "lease_beyond_ttl", r.lease_was),
                    (r.next_bad, "next_attempt_beyond_cadence", r.next_was),
                ):
                    if not bad:
                        continue
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
