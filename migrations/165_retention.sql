-- Migration 165 — retention: what pruning leaves of a job, and the schema's contract (recon_dagster's own).
--
-- recon_pruned_jobs: the prune_history schedule deletes reconcile_events, reconcile_decisions and
-- upstream_creates rows past their retention (docs/operations.md#retention) and, in the same
-- transaction as each batch it deletes, adds what they said to one row per job here, so
-- `recon-dagster explain` of an old job says what was pruned and when instead of "never
-- reconciled". It is itself pruned after RECON_RETENTION_PRUNED_JOBS_DAYS.
--
-- recon_schema_contract: one row, the oldest release contract that may still run against this
-- schema (docs/deploying.md#which-releases-may-run-side-by-side). A release whose contract is older
-- refuses the database with one line when it first connects (recon_dagster/db/schema_contract.py). A
-- later migration that breaks an older release raises oldest_reader; additive ones leave it.
-- Contract 1 is every release up to 0.2.0, which predates the check; 2 is the release that adds it.
--
-- Two new tables of our own: nobody else can hold or wait for a lock on them, so the file is one
-- transaction.
--
-- squawk-ignore-file require-concurrent-index-creation, require-timeout-settings -- its index is on the table this same transaction creates: nobody else can hold or wait for a lock on it

CREATE TABLE IF NOT EXISTS recon_pruned_jobs (
  job_id        uuid PRIMARY KEY,
  -- How many rows of each table were pruned for this job, over every pass.
  events        bigint NOT NULL DEFAULT 0,
  decisions     bigint NOT NULL DEFAULT 0,
  creates       bigint NOT NULL DEFAULT 0,
  -- The pruned attempts' span, the last one's attempt number and outcome, and its run.
  first_at      timestamptz,
  last_at       timestamptz,
  last_attempt  bigint,
  last_outcome  text,
  last_run_id   text,
  -- The task ids of the pruned creates (a job has a handful at most).
  task_ids      text[] NOT NULL DEFAULT '{}',
  pruned_at     timestamptz NOT NULL DEFAULT now()
);

-- The summaries' own retention: by their last attempt.
CREATE INDEX IF NOT EXISTS recon_pruned_jobs_last_at_idx ON recon_pruned_jobs (last_at);

CREATE TABLE IF NOT EXISTS recon_schema_contract (
  only_row       boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  -- The contract this schema was migrated to, and the oldest release contract it still serves.
  contract       bigint NOT NULL,
  oldest_reader  bigint NOT NULL,
  migrated_at    timestamptz NOT NULL DEFAULT now()
);

INSERT INTO recon_schema_contract (contract, oldest_reader) VALUES (2, 1)
ON CONFLICT (only_row) DO UPDATE SET contract = GREATEST(recon_schema_contract.contract, EXCLUDED.contract);
