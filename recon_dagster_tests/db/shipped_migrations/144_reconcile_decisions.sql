-- Migration 144 — reconcile_decisions: what a shadow-mode daemon would have done (recon_dagster's own).
--
-- In shadow mode (RECON_MODE=shadow, or a kind in RECON_SHADOW_KINDS) the sensor, the runs and the
-- sweep work as usual, but where they would act they insert one row here instead and change
-- nothing else. At most one row per job per reconcile cadence, so the table grows with jobs, not
-- with sensor ticks. The shadow_agreement asset compares each row with what became of the job.

CREATE TABLE IF NOT EXISTS reconcile_decisions (
  id                   bigserial PRIMARY KEY,
  job_id               uuid NOT NULL,
  provider_kind        text,
  attempt              integer NOT NULL,
  upstream             text NOT NULL DEFAULT '-',
  action               text NOT NULL,
  reason               text NOT NULL DEFAULT '',
  commit_credits       numeric(14, 4) NOT NULL DEFAULT 0,
  refund_subscription  numeric(14, 4) NOT NULL DEFAULT 0,
  refund_topup         numeric(14, 4) NOT NULL DEFAULT 0,
  run_id               text,
  mode                 text NOT NULL DEFAULT 'shadow',
  created_at           timestamptz NOT NULL DEFAULT now()
);

-- The cadence test (a job's latest decision) and the agreement report's per-job history.
CREATE INDEX IF NOT EXISTS reconcile_decisions_job_idx ON reconcile_decisions (job_id, created_at DESC);
-- Decisions within the cadence window (the sensor widens its scan by that many).
CREATE INDEX IF NOT EXISTS reconcile_decisions_created_idx ON reconcile_decisions (created_at);
