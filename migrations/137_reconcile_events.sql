-- Migration 137 — reconcile_events: one row per reconcile attempt outcome (recon_dagster's own).
--
-- The audit trail behind the Dagster UI: which run did what to which job, and why. The sensor
-- reads it to report the outcomes of the runs that finished since its previous tick.
--
-- recon:replaces sha256:f964b9b707b835a80df97a6a486ed8c5f4d2fbfec495d528b0d17dcdd76a1feb
--   (the first shipped text, without the squawk comments)
--
-- squawk-ignore-file prefer-bigint-over-int, prefer-identity -- column types as first shipped: changing them would change what applied databases hold
-- squawk-ignore-file require-concurrent-index-creation, require-timeout-settings -- its indexes are on the table this same transaction creates: nobody else can hold or wait for a lock on it

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
