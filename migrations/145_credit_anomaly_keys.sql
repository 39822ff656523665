-- Migration 145 — recon_credit_anomaly_keys: one credit anomaly per (job, reason), by a table of our own.
--
-- credit_anomalies belongs to the app, and an app need not have a unique index on (job_id, reason)
-- (recon_dagster used to rely on one with ON CONFLICT). Now each anomaly recon_dagster logs for a
-- job first claims its (job, reason) here: the primary key serialises concurrent writers, and only
-- the writer whose claim is new inserts into credit_anomalies (which it also checks for a row the
-- app, or an earlier version, wrote). Anomalies without a job are not deduplicated, as before.

CREATE TABLE IF NOT EXISTS recon_credit_anomaly_keys (
  job_id     uuid NOT NULL,
  reason     text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, reason)
);
