-- Migration 142 — the sweep's own index, and the not-found breaker counted per kind.
--
-- jobs_taskless_inflight_idx: the sweep reads task-less in-flight rows (legacy rows, sync kinds,
-- async rows that never got a task id) on their own, so a backlog of older async rows with a task
-- id can never fill its batch and starve it. Partial on in-flight, task-less rows: small, and
-- ordered like jobs_inflight_idx (the provider call time) so LIMIT stops early.
CREATE INDEX IF NOT EXISTS jobs_taskless_inflight_idx
  ON jobs (provider_call_started_at)
  WHERE status IN ('pending', 'processing') AND provider_task_id IS NULL;

-- provider_poll_answers.provider_kind: healthy answers of one kind must not dilute another kind's
-- burst of not-found (40 running predictions let 15 of 15 trainings answering 404 fail). NULL on
-- rows written before this migration; they leave the breaker's window within minutes.
ALTER TABLE provider_poll_answers ADD COLUMN IF NOT EXISTS provider_kind text;
