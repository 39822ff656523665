-- Migration 148 — upstream_creates: the create ledger (recon_dagster's own).
--
-- Every create the worker library sends is recorded here before it is sent (its job, kind,
-- provider, when, a fingerprint of the request without secrets, and the job marker the provider
-- echoes back where it has a place for one), and every task id a create returns is recorded the
-- moment it exists, in its own transaction, whatever then happens to the job's row. One job with
-- two task ids here has an orphan: the one its row does not name. The orphan sweep reads it to
-- tell our tasks at the provider from another system's, and writes what became of each task.
--
-- A new table of our own: nobody else can hold or wait for a lock on it, so the file is one
-- transaction and its indexes are built inside it.
--
-- squawk-ignore-file require-concurrent-index-creation, require-timeout-settings -- its indexes are on the table this same transaction creates: nobody else can hold or wait for a lock on it

CREATE TABLE IF NOT EXISTS upstream_creates (
  -- Deterministic: uuid5 of "<job_id>/<seq>" (recon_dagster/db/ledger.py), so a retried write
  -- names the same create.
  id               uuid PRIMARY KEY,
  job_id           uuid NOT NULL,
  -- The job's n-th create, from 1.
  seq              bigint NOT NULL,
  provider         text NOT NULL,
  provider_kind    text NOT NULL,
  -- What the provider echoes back: "<job_id>.<seq>"; marker_sent says whether the request
  -- carried it (a webhook / callBackUrl query parameter, a dubbing's name), '' when unknown.
  marker           text NOT NULL,
  marker_sent      boolean NOT NULL DEFAULT false,
  -- sha256 of the request body as sent, in canonical JSON, without the marker and secrets.
  fingerprint      text NOT NULL,
  intent_at        timestamptz NOT NULL DEFAULT now(),
  -- sending: recorded, not yet answered; created: a task id came back; ambiguous: the answer
  -- was lost after the request may have arrived; refused: certainly no task (an error answer,
  -- never sent); unrecorded: a task id reported with no intent recorded before it.
  state            text NOT NULL DEFAULT 'sending',
  state_at         timestamptz NOT NULL DEFAULT now(),
  task_id          text,
  task_recorded_at timestamptz,
  -- What became of the task, as the orphan sweep (or the worker library) found it: attached
  -- (the job's row names it), adopted, cancelled, orphan_billed, ended, not_found; NULL: not
  -- yet judged.
  fate             text,
  fate_at          timestamptz,
  fate_detail      jsonb NOT NULL DEFAULT '{}'::jsonb,
  -- When the orphan sweep last listed the provider over this create's time window.
  looked_at        timestamptz,
  detail           text NOT NULL DEFAULT '',
  CONSTRAINT upstream_creates_job_seq_key UNIQUE (job_id, seq),
  CONSTRAINT upstream_creates_state_check
    CHECK (state IN ('sending', 'created', 'ambiguous', 'refused', 'unrecorded')),
  CONSTRAINT upstream_creates_seq_check CHECK (seq >= 1)
);

-- A task id is recorded once per provider: the sweep's lookup of a listed task.
CREATE UNIQUE INDEX IF NOT EXISTS upstream_creates_task_idx ON upstream_creates (provider, task_id)
  WHERE task_id IS NOT NULL;
-- The sweep's window of one provider's creates, and the ambiguous ones it must look for.
CREATE INDEX IF NOT EXISTS upstream_creates_provider_intent_idx ON upstream_creates (provider, intent_at);
CREATE INDEX IF NOT EXISTS upstream_creates_unanswered_idx ON upstream_creates (job_id)
  WHERE state IN ('sending', 'ambiguous');
