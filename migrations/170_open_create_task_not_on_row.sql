-- Migration 170 — contract version 3: recon.open_create also holds back a create while a task
-- the ledger recorded for the job is not on the job's row.
--
-- 161 answered 'create' when no create of the job is 'sending' or 'ambiguous'. A worker that
-- records the answer in two steps (create_task, then attach_task: both are contract functions,
-- and the Python library did so) and dies between them leaves the ledger with the task id
-- ('created', or 'unrecorded' without an intent) and the row without it: resume_point answers
-- 'create', 161's open_create answered 'create' too, and the retry sent a second create (billed
-- twice, the first task an orphan). Such a task is provably the job's (the ledger names it): the
-- orphan sweep adopts it onto the row (then resume_point answers 'resume'). Until it has judged
-- the create (its fate set), this function answers 'wait_for_sweep' with reason
-- 'task_not_on_row' and the task id. create_answered writes both in one transaction, so a
-- worker using it never leaves this state.
--
-- Same signature, same answer kinds: a worker built for version 2 already stops on
-- 'wait_for_sweep'. The version moves because what the answer guarantees moved.

SET lock_timeout = '2s';
SET statement_timeout = '30s';

CREATE OR REPLACE FUNCTION recon.contract_version() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 3 $$;

CREATE OR REPLACE FUNCTION recon.open_create(p_job uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
  v upstream_creates;
  v_row_task text;
BEGIN
  SELECT * INTO v FROM upstream_creates
  WHERE job_id = p_job AND task_id IS NULL AND state IN ('sending', 'ambiguous') AND fate IS NULL
  ORDER BY seq DESC LIMIT 1;
  IF FOUND THEN
    RETURN jsonb_build_object('next', 'wait_for_sweep', 'reason', 'create_may_exist',
      'create_id', v.id, 'seq', v.seq, 'state', v.state, 'intent_at', v.intent_at,
      'message', format('job %s: create %s (%s) may have made a task the row does not name; not creating again until the orphan sweep has looked',
                        p_job, v.seq, v.state));
  END IF;
  -- A row that names a task: resume_point answers 'resume' before this is asked.
  SELECT nullif(provider_task_id, '') INTO v_row_task FROM jobs WHERE id = p_job;
  IF v_row_task IS NULL THEN
    SELECT * INTO v FROM upstream_creates
    WHERE job_id = p_job AND task_id IS NOT NULL AND fate IS NULL
    ORDER BY seq DESC LIMIT 1;
    IF FOUND THEN
      RETURN jsonb_build_object('next', 'wait_for_sweep', 'reason', 'task_not_on_row',
        'create_id', v.id, 'seq', v.seq, 'state', v.state, 'intent_at', v.intent_at, 'task_id', v.task_id,
        'message', format('job %s: create %s made task %s, which the row does not name; not creating again until the orphan sweep has adopted it',
                          p_job, v.seq, v.task_id));
    END IF;
  END IF;
  RETURN jsonb_build_object('next', 'create');
END
$$;

-- CREATE OR REPLACE keeps the function's owner and privileges (161's REVOKE from PUBLIC and
-- GRANT to recon_app_worker stand).
