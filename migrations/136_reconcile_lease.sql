-- Migration 136 — reconcile lease and cadence (recon_dagster's own addition; 135 stays as the spec wrote it).
--
-- reconcile_lease_owner / reconcile_lease_expires_at fence a job so two reconcile runs never work
-- it at once: a run claims the lease with a guarded UPDATE and re-checks it before every step; an
-- expired lease (the run crashed) can be claimed again, and that counts as a failed attempt.
--
-- reconcile_next_at spaces attempts at the reconcile cadence (5 minutes), so MAX_ATTEMPTS = 18
-- still means about 90 minutes however often the sensor ticks.
--
-- Nullable columns without a default: a catalog-only change once the lock is granted. The lock is
-- ACCESS EXCLUSIVE on the app's `jobs`, and the app's writes queue behind its wait, so the wait is
-- short and retried with backoff by the migrator.
--
-- recon:replaces sha256:eb21625f5a0eb6abc1df76103a6c9cdd8f191b3bf59d8c279845cfe80cd6998e
--   (the first shipped text: the same ALTER without the timeouts)

SET lock_timeout = '2s';
SET statement_timeout = '5s';

ALTER TABLE jobs
  ADD COLUMN IF NOT EXISTS reconcile_lease_owner      text,
  ADD COLUMN IF NOT EXISTS reconcile_lease_expires_at timestamptz,
  ADD COLUMN IF NOT EXISTS reconcile_next_at          timestamptz;
