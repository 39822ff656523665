-- Migration 136 — reconcile lease and cadence (recon_dagster's own addition; 135 stays as the spec wrote it).
--
-- reconcile_lease_owner / reconcile_lease_expires_at fence a job so two reconcile runs never work
-- it at once: a run claims the lease with a guarded UPDATE and re-checks it before every step; an
-- expired lease (the run crashed) can be claimed again, and that counts as a failed attempt.
--
-- reconcile_next_at spaces attempts at the reconcile cadence (5 minutes), so MAX_ATTEMPTS = 18
-- still means about 90 minutes however often the sensor ticks.

ALTER TABLE jobs
  ADD COLUMN IF NOT EXISTS reconcile_lease_owner      text,
  ADD COLUMN IF NOT EXISTS reconcile_lease_expires_at timestamptz,
  ADD COLUMN IF NOT EXISTS reconcile_next_at          timestamptz;
