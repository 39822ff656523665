-- Migration 146 — no constraint of ours on the app's tables: drop the NaN CHECKs 138 once added.
--
-- The first text of 138 added usage_logs_amount_not_nan, user_credits_subscription_not_nan and
-- user_credits_topup_not_nan (NOT VALID CHECKs refusing 'NaN') to the app's ledger tables: they
-- changed which writes the app may make. recon_dagster keeps its own guard in code (a NaN amount
-- or balance moves no credit and leaves a credit_anomalies row). Each DROP needs ACCESS EXCLUSIVE
-- on an app table for a catalog-only change: a short lock_timeout, retried with backoff by the
-- migrator, which skips the statement (and its lock) where the constraint does not exist.
--
-- squawk-ignore-file ban-drop-constraint -- these are recon_dagster's own (138's first text), never the app's: dropping them gives the app back its own rules

SET lock_timeout = '2s';
SET statement_timeout = '5s';

ALTER TABLE usage_logs DROP CONSTRAINT IF EXISTS usage_logs_amount_not_nan;
ALTER TABLE user_credits DROP CONSTRAINT IF EXISTS user_credits_subscription_not_nan;
ALTER TABLE user_credits DROP CONSTRAINT IF EXISTS user_credits_topup_not_nan;
