-- Migration 151 — recon_balance_samples: a provider's balance as our spend reconciliation sampled it (recon_dagster's own).
--
-- KIE has no per-task billing API: kie_spend judges the change of its credit balance between two
-- samples against the credits our jobs of that window recorded. Each sample names the one it
-- measures from (previous_id), and a sample may be measured from only once (the unique index):
-- two kie_spend runs at once (a backfill, a re-run beside the schedule's) read the same latest
-- sample, and the second one's insert is refused instead of counting the same window twice. The
-- refused run measures again from the sample that won (recon_dagster/db/balance_samples.py).
-- One row per spend run: a few a day, kept (nothing prunes them; they are the chain each window
-- is judged on).
--
-- A new table of our own: nobody else can hold or wait for a lock on it, so the file is one
-- transaction and its index is built inside it.
--
-- squawk-ignore-file require-concurrent-index-creation, require-timeout-settings -- its index is on the table this same transaction creates: nobody else can hold or wait for a lock on it

CREATE TABLE IF NOT EXISTS recon_balance_samples (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  provider     text NOT NULL,
  balance      double precision NOT NULL,
  sampled_at   timestamptz NOT NULL,
  -- The sample this one's window starts at; NULL for a provider's first (its window starts at
  -- the partition's day, or at the last sample Dagster recorded before this table existed).
  previous_id  bigint REFERENCES recon_balance_samples (id),
  -- Which run took it, for the partition of which day (what a reader of the chain follows back).
  run_id       text NOT NULL DEFAULT '',
  partition    text NOT NULL DEFAULT ''
);

-- The guard: one successor per sample, and one first sample per provider (0 stands for "none").
CREATE UNIQUE INDEX IF NOT EXISTS recon_balance_samples_successor_idx
  ON recon_balance_samples (provider, COALESCE(previous_id, 0));
