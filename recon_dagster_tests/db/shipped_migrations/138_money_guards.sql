-- Migration 138 — money guards (recon_dagster's own addition).
--
-- numeric accepts 'NaN', and PostgreSQL orders NaN above every number, so `CHECK (amount >= 0)`
-- lets it through; a NaN refund then turns a user's balance into NaN. These CHECKs refuse NaN in
-- every ledger column from now on. NOT VALID: existing rows are not rescanned (the reconciler
-- already refuses to move a balance by a NaN, leaving a credit_anomalies row instead). Each is
-- added only when missing, so applying the file twice is a no-op.
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'usage_logs_amount_not_nan'
                 AND conrelid = 'usage_logs'::regclass) THEN
    ALTER TABLE usage_logs ADD CONSTRAINT usage_logs_amount_not_nan
      CHECK (amount <> 'NaN'::numeric) NOT VALID;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'user_credits_subscription_not_nan'
                 AND conrelid = 'user_credits'::regclass) THEN
    ALTER TABLE user_credits ADD CONSTRAINT user_credits_subscription_not_nan
      CHECK (subscription_credits <> 'NaN'::numeric) NOT VALID;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'user_credits_topup_not_nan'
                 AND conrelid = 'user_credits'::regclass) THEN
    ALTER TABLE user_credits ADD CONSTRAINT user_credits_topup_not_nan
      CHECK (topup_credits <> 'NaN'::numeric) NOT VALID;
  END IF;
END
$$;

-- The credit-leak check reads the reservations still open, not all of usage_logs: few rows are
-- ever 'reserved' at once, while committed and refunded ones accumulate forever.
CREATE INDEX IF NOT EXISTS usage_logs_reserved_idx ON usage_logs (job_id) WHERE status = 'reserved';

-- The stale scan asks, per candidate row, whether a character's legacy LoRA training waits on it
-- for adoption.
CREATE INDEX IF NOT EXISTS characters_training_job_id_idx ON characters (training_job_id)
  WHERE training_job_id IS NOT NULL;
