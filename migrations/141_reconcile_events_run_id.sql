-- Migration 141 — reconcile_events.run_id: the Dagster run that made each attempt.
--
-- run_key names the unit of work (the lease owner); run_id names the Dagster run that executed
-- it, so every attempt in the audit trail links to its run page (and a run's attempts are one
-- indexed lookup away).
--
-- reconcile_events is recon_dagster's own but written by every reconcile run and grows with the
-- attempts: the column is a catalog-only change under a short lock_timeout, the index is built
-- CONCURRENTLY so running reconcilers never wait for it.
--
-- recon:replaces sha256:89b5dcfb80789a132766a461282459a618f749f5a475e37b5a6162c3e8c236ad
--   (the first shipped text: the same column and index, in one transaction, not CONCURRENTLY)

SET lock_timeout = '2s';
SET statement_timeout = '5s';

ALTER TABLE reconcile_events ADD COLUMN IF NOT EXISTS run_id text;

SET lock_timeout = '10min';
SET statement_timeout = 0;

CREATE INDEX CONCURRENTLY IF NOT EXISTS reconcile_events_run_id_idx ON reconcile_events (run_id);
