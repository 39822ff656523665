-- Migration 166 — an index on upstream_creates (intent_at) for prune_history.
--
-- The create ledger's retention deletes by age across every provider in small batches, oldest
-- first; the existing (provider, intent_at) index serves one provider's window, not that walk.
-- upstream_creates is written by the app's workers (the worker library records every create), so
-- the index is built CONCURRENTLY: no worker waits for it.

SET lock_timeout = '10min';
SET statement_timeout = 0;

CREATE INDEX CONCURRENTLY IF NOT EXISTS upstream_creates_intent_at_idx ON upstream_creates (intent_at);
