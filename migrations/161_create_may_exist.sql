-- Migration 161 — contract version 2: recon.open_create(p_job), what a retried handler asks
-- before it creates.
--
-- resume_point (160) reads only the job's row: a handler killed after its create left but before
-- the answer was recorded leaves the row without a task id and the ledger with a create in
-- 'sending' (or 'ambiguous' when the loss was recorded). resume_point answers 'create', and a
-- retry that obeyed would send a second create while the first task may exist: billed twice, the
-- design's incident. This function answers 'create' only when no create of the job may still
-- have made a task the row does not name; else 'wait_for_sweep' with that create (the orphan
-- sweep adopts its task onto the row, then resume_point answers 'resume'; or it marks the create
-- not_found, then a create is safe).
--
-- Added, not changed: no signature of 160 moves (workers built for version 1 keep working).

SET lock_timeout = '2s';
SET statement_timeout = '30s';

CREATE OR REPLACE FUNCTION recon.contract_version() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 2 $$;

CREATE OR REPLACE FUNCTION recon.open_create(p_job uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
  v upstream_creates;
BEGIN
  SELECT * INTO v FROM upstream_creates
  WHERE job_id = p_job AND task_id IS NULL AND state IN ('sending', 'ambiguous') AND fate IS NULL
  ORDER BY seq DESC LIMIT 1;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('next', 'create');
  END IF;
  RETURN jsonb_build_object('next', 'wait_for_sweep', 'reason', 'create_may_exist',
    'create_id', v.id, 'seq', v.seq, 'state', v.state, 'intent_at', v.intent_at,
    'message', format('job %s: create %s (%s) may have made a task the row does not name; not creating again until the orphan sweep has looked',
                      p_job, v.seq, v.state));
END
$$;

REVOKE ALL ON FUNCTION recon.open_create(uuid) FROM PUBLIC;

DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'recon_app_worker') THEN
    GRANT EXECUTE ON FUNCTION recon.open_create(uuid) TO recon_app_worker;
  END IF;
END
$$;
