-- Migration 137 — reconcile_events: one row per reconcile attempt outcome (recon_dagster's own).
--
-- The audit trail behind the Dagster UI: which run did what to which job, and why. The sensor
-- reads it to report the outcomes of the runs that finished since its previous tick.

CREATE TABLE IF NOT EXISTS reconcile_events (
  id            bigserial PRIMARY KEY,
  job_id        uuid NOT NULL,
  provider_kind text,
  attempt       int NOT NULL,
  outcome       text NOT NULL,
  detail        text,
  run_key       text,
  duration_ms   int,
  created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS reconcile_events_created_at_idx ON reconcile_events (created_at);
CREATE INDEX IF NOT EXISTS reconcile_events_job_id_idx ON reconcile_events (job_id);
