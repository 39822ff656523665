-- Migration 149 — the job row is ownership: find the job that names a listed task.
--
-- jobs_provider_task_idx: the orphan sweep (every 10 minutes) and the spend reconciliation look up
-- which job rows name the tasks a provider listed (jobs.provider_task_id = ANY(...)): a row naming a
-- task makes it ours even when the create ledger never heard of it (an app that writes the task id
-- on its row, as the spec's contract asks, but not the ledger). Without it each sweep scans the
-- app's whole jobs table. Partial: rows without a task id are never looked up. A hash index: the
-- look-up is by equality only, and a btree here would also answer `provider_task_id IS NOT NULL`,
-- which the planner then took for the stale sweep's tasked branches (a walk over every tasked row
-- the app ever wrote, in place of the in-flight indexes; test_sweep_starvation.py pins it).
-- Built CONCURRENTLY on the app's `jobs` (the app's reads and writes go on); lock_timeout bounds
-- each of the build's waits for older transactions, so it is long (see 135).
SET lock_timeout = '10min';
SET statement_timeout = 0;

CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_provider_task_idx
  ON jobs USING hash (provider_task_id)
  WHERE provider_task_id IS NOT NULL;
