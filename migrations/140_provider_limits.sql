-- Migration 140 — provider account limits shared by every process and host (recon_dagster's own).
--
-- A provider's rate limit belongs to the account (its API key), not to a process: every Dagster
-- run worker, the sweep and the app's own workers draw on the same budget through these tables.
--
-- recon:replaces sha256:c774620696f118290277ced44115689b740a75dc780a4aa95f5452d625068770
--   (the first shipped text, without the squawk comment)
--
-- squawk-ignore-file prefer-bigint-over-int -- column types as first shipped: changing them would change what applied databases hold

-- One row per account: when the provider last asked everyone to back off (Retry-After).
CREATE TABLE IF NOT EXISTS provider_limit_accounts (
  account        text PRIMARY KEY,
  blocked_until  timestamptz NOT NULL DEFAULT 'epoch',
  retry_afters   bigint NOT NULL DEFAULT 0,
  updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Token buckets, one per account and request class ('read', 'create'). A caller reserves one
-- token with a single UPDATE ... RETURNING; the balance may go negative, and the caller then
-- sleeps until its token exists. rate and burst are rewritten from the configuration on start.
CREATE TABLE IF NOT EXISTS provider_limit_buckets (
  account     text NOT NULL,
  bucket      text NOT NULL,
  rate_per_s  double precision NOT NULL,
  burst       double precision NOT NULL,
  tokens      double precision NOT NULL,
  stamp       timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (account, bucket)
);

-- Concurrency slots: a request holds one for its duration. A holder that dies leaves its slot
-- behind until expires_at, then anyone may take it.
CREATE TABLE IF NOT EXISTS provider_limit_slots (
  account     text NOT NULL,
  slot        int NOT NULL,
  holder      text,
  kind        text,
  expires_at  timestamptz NOT NULL DEFAULT 'epoch',
  PRIMARY KEY (account, slot)
);
