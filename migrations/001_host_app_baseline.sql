-- Baseline of the host app's tables that recon_dagster reads and writes.
--
-- These tables belong to the app. `recon-dagster migrate` runs this file only on a database that
-- has none of them (a new, test or demo database), in one transaction. On a database that has any
-- of them it runs nothing of this file: it checks that every table and column below exists with a
-- compatible type (and a default where recon_dagster's inserts leave a NOT NULL column out), prints
-- one line per gap and changes nothing of the app's (db/baseline.py).
--
-- recon:replaces sha256:c7ef4e30855e07368d16dd93ac7d89dfd44f2c2f27e2811093bbe4d680893588
--   (the first shipped text: the same tables and indexes, without the squawk comments)
--
-- squawk-ignore-file prefer-bigint-over-int, prefer-identity -- the app's column types, as the app has them
-- squawk-ignore-file require-concurrent-index-creation, require-timeout-settings -- every table here is created by this same transaction on a database without the app's tables: nobody else can hold or wait for a lock on them

CREATE TABLE IF NOT EXISTS user_credits (
  user_id              uuid PRIMARY KEY,
  subscription_credits numeric(14, 4) NOT NULL DEFAULT 0 CHECK (subscription_credits >= 0),
  topup_credits        numeric(14, 4) NOT NULL DEFAULT 0 CHECK (topup_credits >= 0),
  public_outputs       boolean NOT NULL DEFAULT true,
  updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS workflow_executions (
  id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  user_id       uuid NOT NULL,
  status        text NOT NULL DEFAULT 'running'
                CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
  failed_nodes  jsonb NOT NULL DEFAULT '[]'::jsonb,
  mcp_client    text,
  error_message text,
  created_at    timestamptz NOT NULL DEFAULT now(),
  updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS jobs (
  id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  user_id               uuid NOT NULL,
  job_type              text NOT NULL,
  status                text NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'processing', 'completed', 'failed', 'cancelled')),
  input_data            jsonb NOT NULL DEFAULT '{}'::jsonb,
  output_data           jsonb,
  error_message         text,
  progress              integer NOT NULL DEFAULT 0,
  started_at            timestamptz,
  completed_at          timestamptz,
  should_watermark      boolean,
  is_public             boolean,
  workflow_execution_id uuid REFERENCES workflow_executions (id),
  node_id               text,
  provider              text,
  provider_cost         numeric(14, 6),
  display_cost          numeric(14, 4),
  created_at            timestamptz NOT NULL DEFAULT now(),
  updated_at            timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS jobs_user_id_idx ON jobs (user_id, created_at DESC);
CREATE INDEX IF NOT EXISTS jobs_workflow_execution_id_idx ON jobs (workflow_execution_id)
  WHERE workflow_execution_id IS NOT NULL;

-- One reservation per job; metadata records the pool split, {"from_sub": x, "from_topup": y},
-- which is where a refund must put the credits back.
CREATE TABLE IF NOT EXISTS usage_logs (
  id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  job_id            uuid REFERENCES jobs (id),
  user_id           uuid NOT NULL,
  status            text NOT NULL DEFAULT 'reserved'
                    CHECK (status IN ('reserved', 'committed', 'refunded')),
  amount            numeric(14, 4) NOT NULL CHECK (amount >= 0),
  provider_cost_usd numeric(14, 6),
  metadata          jsonb NOT NULL DEFAULT '{}'::jsonb,
  created_at        timestamptz NOT NULL DEFAULT now(),
  settled_at        timestamptz
);

CREATE INDEX IF NOT EXISTS usage_logs_job_id_idx ON usage_logs (job_id);

CREATE TABLE IF NOT EXISTS assets (
  id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  user_id     uuid NOT NULL,
  job_id      uuid NOT NULL REFERENCES jobs (id),
  asset_type  text NOT NULL,
  storage_key text NOT NULL,
  url         text,
  is_public   boolean NOT NULL,
  metadata    jsonb NOT NULL DEFAULT '{}'::jsonb,
  created_at  timestamptz NOT NULL DEFAULT now()
);

-- The demo app's own rule (a real app may have it or not): one asset per job. recon_dagster does
-- not rely on it: it inserts a job's asset only when the job has none, under the job row's lock.
CREATE UNIQUE INDEX IF NOT EXISTS assets_job_id_key ON assets (job_id);

CREATE TABLE IF NOT EXISTS credit_anomalies (
  id         bigserial PRIMARY KEY,
  job_id     uuid,
  user_id    uuid,
  reason     text NOT NULL,
  amount     numeric(14, 4),
  details    jsonb NOT NULL DEFAULT '{}'::jsonb,
  created_at timestamptz NOT NULL DEFAULT now()
);

-- The demo app's own rule, as above: recon_dagster dedupes its anomalies through a table of its
-- own (recon_credit_anomaly_keys, migration 145).
CREATE UNIQUE INDEX IF NOT EXISTS credit_anomalies_job_reason_key ON credit_anomalies (job_id, reason);

-- Character LoRA training state (the legacy reconcileOrphanedTrainings cron watches these).
CREATE TABLE IF NOT EXISTS characters (
  id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  user_id               uuid NOT NULL,
  name                  text NOT NULL,
  training_status       text NOT NULL DEFAULT 'pending'
                        CHECK (training_status IN ('pending', 'training', 'ready', 'failed')),
  replicate_training_id text,
  training_job_id       uuid REFERENCES jobs (id),
  lora_weights_url      text,
  error_message         text,
  training_started_at   timestamptz,
  created_at            timestamptz NOT NULL DEFAULT now(),
  updated_at            timestamptz NOT NULL DEFAULT now()
);
