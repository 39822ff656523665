-- Migration 147 — reconcile_events.cause: whose fault the end of an attempt was.
--
-- Provider health counts a provider's answers (or its failures to answer) per distinct job; a
-- job's own bad result (media that is not what was promised, another task's result, an answer
-- unreadable for that one job) and our own errors must never count against the provider.
-- Values: answered, provider, job, internal, not_asked (recon_dagster/reconcile/cause.py); NULL on
-- rows written before this migration and on operator actions.
--
-- reconcile_events is recon_dagster's own but written by every reconcile run: the column is a
-- catalog-only change under a short lock_timeout, the backfill touches only the last hour's rows
-- (row locks, never the table's), and the index is built CONCURRENTLY so running reconcilers never
-- wait for it.

SET lock_timeout = '2s';
SET statement_timeout = '5s';

ALTER TABLE reconcile_events ADD COLUMN IF NOT EXISTS cause text;

-- The backfill scans the table (no index on created_at yet): no statement timeout.
SET statement_timeout = 0;

-- Rows of the last hour (the health window is 30 minutes) get the cause their text shows, so
-- provider health does not read "idle" right after the upgrade: a failed poll's detail starts
-- with "poll failed:", an answered poll's outcome says so.
UPDATE reconcile_events SET cause = CASE
    WHEN outcome IN ('recovered', 'failed', 'still_running') THEN 'answered'
    WHEN outcome IN ('error', 'exhausted') AND starts_with(detail, 'poll failed:') THEN 'provider'
    WHEN outcome IN ('error', 'exhausted') AND detail ~ '^[0-9]+ attempts: poll failed:' THEN 'provider'
    END
WHERE cause IS NULL AND created_at > now() - interval '1 hour'
  AND outcome IN ('recovered', 'failed', 'still_running', 'error', 'exhausted');

SET lock_timeout = '10min';

-- Health reads the window's rows of each kind, latest per job.
CREATE INDEX CONCURRENTLY IF NOT EXISTS reconcile_events_kind_created_idx ON reconcile_events (provider_kind, created_at);
