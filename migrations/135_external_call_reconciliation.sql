-- Migration 135 — External-call reconciliation (jobs-table columns + inflight-index)
--
-- Five new columns track external provider tasks so a cron can find stuck rows and
-- either recover them (async, with provider_task_id) or sweep them (sync, no task_id).
--
-- Decision references:
--   D1: Single set of columns on `jobs`, not a side table (every job has ≤ 1 external call).
--   D8: `provider_call_started_at` distinct from `started_at` (set once at API call;
--       NOT re-written on BullMQ stall-retry, so threshold math is stable).
--   D9: Sync HTTP routes (ai-writer, video-composer, etc.) set these directly;
--       async workers set via onTaskCreated callback.
--
-- Index `jobs_inflight_idx` covers BOTH 'pending' and 'processing' states so a
-- route-handler crash before the `pending → processing` flip still surfaces the row.
--
-- What this creates is the design's section 4, unchanged. How it runs on a live `jobs` table is
-- recon_dagster's (docs/deviations.md): each statement is its own transaction, the ALTER waits at
-- most lock_timeout for its ACCESS EXCLUSIVE lock (the app's writes to `jobs` queue behind that
-- wait, so it is short; the migrator retries with backoff), and the index is built CONCURRENTLY.
--
-- recon:replaces sha256:9b6a83890016ff755e9c527e82b5b947244e304cd61c17fb16e1e5014e715288
--   (the first shipped text: the same statements in one transaction, the index not CONCURRENTLY)
--
-- squawk-ignore-file prefer-bigint-over-int -- the design's column type (section 4)

SET lock_timeout = '2s';
SET statement_timeout = '5s';

ALTER TABLE jobs
  ADD COLUMN IF NOT EXISTS provider_kind            text,
  ADD COLUMN IF NOT EXISTS provider_task_id         text,
  ADD COLUMN IF NOT EXISTS provider_call_started_at timestamptz,
  ADD COLUMN IF NOT EXISTS reconcile_attempts       int  NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS reconcile_last_error     text;

-- A concurrent build holds SHARE UPDATE EXCLUSIVE: the app's reads and writes go on. It waits for
-- the transactions already writing `jobs` (and, at its end, for older snapshots); lock_timeout
-- bounds each of those waits, so it is long here: a short one would abort the build behind any
-- worker transaction that lasts a few seconds and leave an INVALID index (which the migrator drops
-- and builds again on its next try).
SET lock_timeout = '10min';
SET statement_timeout = 0;

CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_inflight_idx
  ON jobs (provider_call_started_at)
  WHERE status IN ('pending', 'processing');
