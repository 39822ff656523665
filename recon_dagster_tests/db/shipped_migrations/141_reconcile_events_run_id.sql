-- Migration 141 — reconcile_events.run_id: the Dagster run that made each attempt.
--
-- run_key names the unit of work (the lease owner); run_id names the Dagster run that executed
-- it, so every attempt in the audit trail links to its run page (and a run's attempts are one
-- indexed lookup away).

ALTER TABLE reconcile_events ADD COLUMN IF NOT EXISTS run_id text;

CREATE INDEX IF NOT EXISTS reconcile_events_run_id_idx ON reconcile_events (run_id);
