-- Baseline of the host app's tables that recon_dagster reads and writes.
--
-- Production databases already have these (they belong to the app); this file exists so a new or
-- test database has the same shape. Every statement is IF NOT EXISTS so applying it to the app's
-- real database is a no-op.

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

-- A job produces one asset: a second finalize (worker racing the reconciler, a late webhook)
-- cannot add a duplicate.
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
