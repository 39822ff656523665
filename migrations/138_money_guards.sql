-- Migration 138 — indexes for the credit-leak check and the LoRA adoption scan (recon_dagster's own).
--
-- recon:replaces sha256:93b0c32c2c082eacd18aa3b124e170daa85e73d332e6d670ea1449af9387c564
--   (the first shipped text also added three NOT VALID CHECKs refusing NaN to the app's
--   usage_logs and user_credits: a constraint of ours on the app's tables. Migration 146 drops
--   them where that text ran; the reconciler itself never moves a balance by a NaN and leaves a
--   credit_anomalies row instead. Its indexes were built without CONCURRENTLY.)
--
-- Both tables belong to the app: each index is built CONCURRENTLY (SHARE UPDATE EXCLUSIVE: the
-- app's reads and writes go on), in its own transaction. lock_timeout bounds each of the build's
-- waits for older transactions, so it is long: a short one would abort the build behind a worker
-- transaction of a few seconds and leave an INVALID index (the migrator drops it and builds again).

SET lock_timeout = '10min';
SET statement_timeout = 0;

-- The credit-leak check reads the reservations still open, not all of usage_logs: few rows are
-- ever 'reserved' at once, while committed and refunded ones accumulate forever.
CREATE INDEX CONCURRENTLY IF NOT EXISTS usage_logs_reserved_idx ON usage_logs (job_id) WHERE status = 'reserved';

-- The stale scan asks, per candidate row, whether a character's legacy LoRA training waits on it
-- for adoption.
CREATE INDEX CONCURRENTLY IF NOT EXISTS characters_training_job_id_idx ON characters (training_job_id)
  WHERE training_job_id IS NOT NULL;
