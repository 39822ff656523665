-- Migration 145 — recon_credit_anomaly_keys: one credit anomaly per (job, reason), by a table of our own.
--
-- credit_anomalies belongs to the app, and an app need not have a unique index on (job_id, reason)
-- (recon_dagster used to rely on one with ON CONFLICT). Now a writer of an anomaly for a job first
-- upserts its (job, reason) here: the primary key makes a concurrent writer of the same pair wait
-- for the first one's transaction, and each then inserts into credit_anomalies only if no such
-- row exists (db/credits.py log_credit_anomaly). Anomalies without a job are not deduplicated, as
-- before.

CREATE TABLE IF NOT EXISTS recon_credit_anomaly_keys (
  job_id     uuid NOT NULL,
  reason     text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, reason)
);
