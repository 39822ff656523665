-- Migration 160 — the app workers' contract as functions in the app's database (contract version 1).
--
-- Everything recon_dagster asks of the app's workers, one function per step of a worker's life,
-- in recon_dagster's own schema ``recon``: a worker in any language (node-postgres, supabase-js
-- rpc(), psycopg) keeps the contract by calling them, and the Python worker library
-- (recon_dagster.worker) is itself a thin caller of the same functions. docs/app-contract.md is
-- the contract in the app's words.
--
-- Every function answers a jsonb object whose "next" says what the caller must do next (call,
-- send, poll, resume, create, stop, not_sent, fix_call, ...), with "reason" and a one-line
-- "message" when it is not the plain go-ahead: never a bare error for a case the contract knows.
--
-- Functions change only by adding (a new name, or a new contract version answered by
-- recon.contract_version()), never by changing what an existing signature means while workers run.
--
-- The functions run with the caller's rights and name the tables as the caller's search_path
-- finds them (as the app's own statements do; a function that ran as its owner would let a caller
-- choose what its unqualified names mean). The role recon_app_worker gets EXECUTE and what the
-- functions need of recon_dagster's own tables; the app's workers already read and update jobs
-- and insert credit_anomalies. Grant it to the role the workers log in as
-- (GRANT recon_app_worker TO service_role). Where the migrating role may not create roles, the
-- role is left out with a notice and the grants are made by hand (docs/app-contract.md).
--
-- New objects only (a schema, a role, functions): nothing of the app's is locked but for the rows
-- the functions write when called. One transaction, bounded: it waits for no lock of the app's.

SET lock_timeout = '2s';
SET statement_timeout = '30s';

CREATE SCHEMA IF NOT EXISTS recon;

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'recon_app_worker') THEN
    CREATE ROLE recon_app_worker NOLOGIN;
  END IF;
EXCEPTION
  WHEN duplicate_object OR unique_violation THEN NULL;  -- another database's migrate made it first
  WHEN insufficient_privilege THEN
    RAISE NOTICE 'recon_app_worker not created (no CREATEROLE): grant EXECUTE on schema recon''s functions by hand';
END
$$;

-- The contract's version: a worker built for a newer one refuses to start (run migrate).
CREATE OR REPLACE FUNCTION recon.contract_version() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1 $$;

-- ---------------------------------------------------------------------------------------------
-- Identity of a create: the job's n-th create has id uuid5(namespace, "<job>/<n>") and marker
-- "<job>.<n>" (db/ledger.py's create_id / marker_for; the orphan sweep maps a marker back to the
-- id). SHA-1 is written out here because core PostgreSQL has no sha1() and an extension
-- (pgcrypto, uuid-ossp) may be missing or live in a schema the functions cannot name.
-- ---------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION recon.sha1(p_data bytea) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
  m  constant bigint := 4294967295;
  h0 bigint := 1732584193;
  h1 bigint := 4023233417;
  h2 bigint := 2562383102;
  h3 bigint := 271733878;
  h4 bigint := 3285377520;
  msg bytea := p_data || '\x80'::bytea;
  w  bigint[];
  a bigint; b bigint; c bigint; d bigint; e bigint; f bigint; k bigint; t bigint;
  o int;
BEGIN
  WHILE length(msg) % 64 <> 56 LOOP
    msg := msg || '\x00'::bytea;
  END LOOP;
  msg := msg || int8send(length(p_data)::bigint * 8);
  FOR blk IN 0 .. length(msg) / 64 - 1 LOOP
    w := array_fill(0::bigint, ARRAY[80]);
    FOR i IN 0 .. 15 LOOP
      o := blk * 64 + i * 4;
      w[i + 1] := (get_byte(msg, o)::bigint << 24) | (get_byte(msg, o + 1)::bigint << 16)
                | (get_byte(msg, o + 2)::bigint << 8) | get_byte(msg, o + 3)::bigint;
    END LOOP;
    FOR i IN 16 .. 79 LOOP
      t := w[i - 2] # w[i - 7] # w[i - 13] # w[i - 15];
      w[i + 1] := ((t << 1) | (t >> 31)) & m;
    END LOOP;
    a := h0; b := h1; c := h2; d := h3; e := h4;
    FOR i IN 0 .. 79 LOOP
      IF i < 20 THEN
        f := (b & c) | ((b # m) & d); k := 1518500249;
      ELSIF i < 40 THEN
        f := b # c # d; k := 1859775393;
      ELSIF i < 60 THEN
        f := (b & c) | (b & d) | (c & d); k := 2400959708;
      ELSE
        f := b # c # d; k := 3395469782;
      END IF;
      t := ((((a << 5) | (a >> 27)) & m) + f + e + k + w[i + 1]) & m;
      e := d; d := c; c := ((b << 30) | (b >> 2)) & m; b := a; a := t;
    END LOOP;
    h0 := (h0 + a) & m; h1 := (h1 + b) & m; h2 := (h2 + c) & m; h3 := (h3 + d) & m; h4 := (h4 + e) & m;
  END LOOP;
  RETURN substring(int8send(h0) FROM 5) || substring(int8send(h1) FROM 5) || substring(int8send(h2) FROM 5)
      || substring(int8send(h3) FROM 5) || substring(int8send(h4) FROM 5);
END
$$;

CREATE OR REPLACE FUNCTION recon.create_id(p_job uuid, p_seq bigint) RETURNS uuid
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
  h bytea := recon.sha1(decode('6c2b7f6453d55a0e9a557265636f6e39', 'hex')
                        || convert_to(p_job::text || '/' || p_seq::text, 'UTF8'));
BEGIN
  h := set_byte(h, 6, (get_byte(h, 6) & 15) | 80);    -- version 5
  h := set_byte(h, 8, (get_byte(h, 8) & 63) | 128);   -- RFC 4122 variant
  RETURN encode(substring(h FROM 1 FOR 16), 'hex')::uuid;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- The create ledger (upstream_creates, migration 148)
-- ---------------------------------------------------------------------------------------------

-- Before the create leaves: the job's next create, its id, number and the marker to send.
CREATE OR REPLACE FUNCTION recon.create_intent(
  p_job uuid, p_provider text, p_kind text, p_fingerprint text DEFAULT '', p_marker_sent boolean DEFAULT true
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_seq bigint;
  v_row upstream_creates;
BEGIN
  IF p_job IS NULL OR coalesce(btrim(p_provider), '') = '' OR coalesce(btrim(p_kind), '') = '' THEN
    RETURN jsonb_build_object('next', 'fix_call', 'reason', 'invalid_argument',
      'message', 'create_intent needs a job id, a provider and a kind');
  END IF;
  -- Serialises the numbering of one job's creates (a transaction-scoped lock: nothing stays).
  PERFORM pg_advisory_xact_lock(hashtextextended(p_job::text, 148));
  SELECT coalesce(max(seq), 0) + 1 INTO v_seq FROM upstream_creates WHERE job_id = p_job;
  INSERT INTO upstream_creates AS u (id, job_id, seq, provider, provider_kind, marker, marker_sent, fingerprint)
  VALUES (recon.create_id(p_job, v_seq), p_job, v_seq, p_provider, p_kind, p_job::text || '.' || v_seq::text,
          coalesce(p_marker_sent, false), coalesce(p_fingerprint, ''))
  ON CONFLICT (id) DO UPDATE SET id = EXCLUDED.id
  RETURNING * INTO v_row;
  RETURN jsonb_build_object('next', 'send', 'create_id', v_row.id, 'seq', v_row.seq,
    'marker', v_row.marker, 'create', to_jsonb(v_row));
END
$$;

-- A task id a create returned, into the ledger only (its own transaction in the Python library,
-- before the job's row is touched, so a worker killed in between leaves it for the orphan sweep).
-- With p_create (its intent) that row gets it; without, or when the intent already holds another
-- task id, a row of its own in state 'unrecorded'. The same task id again answers the row holding it.
CREATE OR REPLACE FUNCTION recon.create_task(
  p_job uuid, p_provider text, p_kind text, p_task_id text, p_create uuid DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_row upstream_creates;
  v_intent jsonb;
BEGIN
  IF p_task_id IS NULL OR btrim(p_task_id) = '' THEN
    RETURN jsonb_build_object('next', 'fix_call', 'reason', 'invalid_task_id',
      'message', format('provider task id must be a non-empty string, got %s', coalesce(quote_literal(p_task_id), 'NULL')));
  END IF;
  SELECT * INTO v_row FROM upstream_creates WHERE provider = p_provider AND task_id = p_task_id;
  IF FOUND THEN
    RETURN jsonb_build_object('next', 'attach', 'create_id', v_row.id, 'create', to_jsonb(v_row));
  END IF;
  IF p_create IS NOT NULL THEN
    UPDATE upstream_creates SET task_id = p_task_id, task_recorded_at = now(), state = 'created', state_at = now()
    WHERE id = p_create AND task_id IS NULL
    RETURNING * INTO v_row;
    IF FOUND THEN
      RETURN jsonb_build_object('next', 'attach', 'create_id', v_row.id, 'create', to_jsonb(v_row));
    END IF;
  END IF;
  v_intent := recon.create_intent(p_job, p_provider, p_kind, '', false);
  IF v_intent ->> 'next' <> 'send' THEN
    RETURN v_intent;
  END IF;
  UPDATE upstream_creates SET task_id = p_task_id, task_recorded_at = now(), state = 'unrecorded', state_at = now()
  WHERE id = (v_intent ->> 'create_id')::uuid
  RETURNING * INTO v_row;
  RETURN jsonb_build_object('next', 'attach', 'create_id', v_row.id, 'create', to_jsonb(v_row));
END
$$;

-- A create that raised without a task id: 'ambiguous' (the answer was lost; a task may exist) or
-- 'refused' (certainly none). Only from 'sending': a task id recorded first wins.
CREATE OR REPLACE FUNCTION recon.create_lost(p_create uuid, p_state text, p_detail text DEFAULT '') RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_id uuid;
BEGIN
  IF p_state IS NULL OR p_state NOT IN ('ambiguous', 'refused') THEN
    RETURN jsonb_build_object('next', 'fix_call', 'reason', 'invalid_state',
      'message', format('create_lost takes ambiguous or refused, not %s', coalesce(p_state, 'NULL')));
  END IF;
  UPDATE upstream_creates SET state = p_state, state_at = now(), detail = left(coalesce(p_detail, ''), 2000)
  WHERE id = p_create AND state = 'sending' AND task_id IS NULL
  RETURNING id INTO v_id;
  RETURN jsonb_build_object('next', 'done', 'written', v_id IS NOT NULL, 'state', p_state);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- The job's row (the app's jobs table): guarded writes, only while the row is in flight
-- ---------------------------------------------------------------------------------------------

-- Why no upstream work may start for a job that was not written: missing, or no longer in flight.
CREATE OR REPLACE FUNCTION recon.job_stop(p_job uuid, p_extra jsonb DEFAULT '{}'::jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
  v_status text;
BEGIN
  SELECT status INTO v_status FROM jobs WHERE id = p_job;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('next', 'stop', 'reason', 'job_not_found',
      'message', format('job %s does not exist', p_job)) || p_extra;
  END IF;
  RETURN jsonb_build_object('next', 'stop', 'reason', 'job_not_in_flight', 'status', v_status,
    'message', format('job %s is %s, no longer in flight: no upstream work started for it', p_job, v_status))
    || p_extra;
END
$$;

-- A sync call, right before it: the row's kind and start time (never its status, spec 5.8).
CREATE OR REPLACE FUNCTION recon.mark_call_start(p_job uuid, p_kind text) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF p_job IS NULL OR coalesce(btrim(p_kind), '') = '' THEN
    RETURN jsonb_build_object('next', 'fix_call', 'reason', 'invalid_argument',
      'message', 'mark_call_start needs a job id and a kind');
  END IF;
  UPDATE jobs SET provider_kind = p_kind, provider_call_started_at = now(), updated_at = now()
  WHERE id = p_job AND status IN ('pending', 'processing');
  IF FOUND THEN
    RETURN jsonb_build_object('next', 'call');
  END IF;
  RETURN recon.job_stop(p_job);
END
$$;

-- One anomaly per (job, reason), for every writer of one (the worker's functions here and
-- db/credits.py's log_credit_anomaly): credit_anomalies is the app's table and need not have a
-- unique index on (job_id, reason), so the (job, reason)'s key row in recon_credit_anomaly_keys
-- (migration 145) comes first (a concurrent writer of the same pair waits for this transaction),
-- then the anomaly only if none exists (a new statement: a fresh snapshot that sees what such a
-- writer committed). An anomaly without a job is always written. True if newly written.
CREATE OR REPLACE FUNCTION recon.credit_anomaly(
  p_job uuid, p_user uuid, p_reason text, p_details jsonb DEFAULT '{}'::jsonb, p_amount numeric DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_new boolean;
BEGIN
  IF p_job IS NOT NULL THEN
    INSERT INTO recon_credit_anomaly_keys (job_id, reason) VALUES (p_job, p_reason)
    ON CONFLICT (job_id, reason) DO UPDATE SET created_at = recon_credit_anomaly_keys.created_at;
  END IF;
  INSERT INTO credit_anomalies (job_id, user_id, reason, amount, details)
  SELECT p_job, p_user, p_reason, p_amount, coalesce(p_details, '{}'::jsonb)
  WHERE p_job IS NULL OR NOT EXISTS (SELECT 1 FROM credit_anomalies c WHERE c.job_id = p_job AND c.reason = p_reason)
  RETURNING true INTO v_new;
  RETURN coalesce(v_new, false);
END
$$;

-- The task id onto the job's row: kind and start time kept if set (a stall-retry never moves
-- them), a different task id already there never overwritten, a row no longer in flight never
-- written. A task that then has no job to answer for it is recorded as a credit anomaly.
CREATE OR REPLACE FUNCTION recon.attach_task(p_job uuid, p_kind text, p_task_id text) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_persisted text;
  v_status text;
  v_user uuid;
BEGIN
  IF p_task_id IS NULL OR btrim(p_task_id) = '' THEN
    RETURN jsonb_build_object('next', 'fix_call', 'reason', 'invalid_task_id',
      'message', format('provider task id must be a non-empty string, got %s', coalesce(quote_literal(p_task_id), 'NULL')));
  END IF;
  UPDATE jobs SET
    provider_kind = CASE WHEN provider_task_id IS NULL OR provider_task_id = p_task_id THEN p_kind ELSE provider_kind END,
    provider_task_id = coalesce(provider_task_id, p_task_id),
    provider_call_started_at = coalesce(provider_call_started_at, now()),
    updated_at = now()
  WHERE id = p_job AND status IN ('pending', 'processing')
  RETURNING provider_task_id, user_id INTO v_persisted, v_user;
  IF v_persisted = p_task_id THEN
    RETURN jsonb_build_object('next', 'poll', 'task_id', p_task_id);
  END IF;
  IF v_persisted IS NOT NULL THEN
    -- Two attempts both created upstream; ours is an orphan that may bill.
    PERFORM recon.credit_anomaly(p_job, v_user, 'duplicate_upstream_task',
      jsonb_build_object('kind', p_kind, 'persisted_task_id', v_persisted, 'orphan_task_id', p_task_id));
    RETURN jsonb_build_object('next', 'resume', 'reason', 'task_already_persisted', 'task_id', v_persisted,
      'orphan_task_id', p_task_id,
      'message', format('job %s already has upstream task %s; not polling duplicate %s', p_job, v_persisted, p_task_id));
  END IF;
  SELECT status, user_id INTO v_status, v_user FROM jobs WHERE id = p_job;
  IF FOUND THEN
    -- The task exists and may bill, but the row's credits are settled: nobody collects or pays
    -- for it. The ledger holds it: the orphan sweep cancels it.
    PERFORM recon.credit_anomaly(p_job, v_user, 'upstream_task_for_ended_job',
      jsonb_build_object('kind', p_kind, 'task_id', p_task_id, 'job_status', v_status));
  END IF;
  RETURN recon.job_stop(p_job, jsonb_build_object('task_id', p_task_id));
END
$$;

-- A create's answer in one transaction: the ledger, then the job's row.
CREATE OR REPLACE FUNCTION recon.create_answered(
  p_job uuid, p_provider text, p_kind text, p_task_id text, p_create uuid DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_ledger jsonb := recon.create_task(p_job, p_provider, p_kind, p_task_id, p_create);
BEGIN
  IF v_ledger ->> 'next' <> 'attach' THEN
    RETURN v_ledger;
  END IF;
  RETURN recon.attach_task(p_job, p_kind, p_task_id) || jsonb_build_object('create_id', v_ledger -> 'create_id');
END
$$;

-- A retried handler, before anything else: resume the task the row names, or create, or stop.
CREATE OR REPLACE FUNCTION recon.resume_point(p_job uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
  v jobs;
BEGIN
  SELECT * INTO v FROM jobs WHERE id = p_job;
  IF NOT FOUND OR v.status NOT IN ('pending', 'processing') THEN
    RETURN recon.job_stop(p_job);
  END IF;
  IF v.provider_task_id IS NOT NULL AND v.provider_task_id <> '' THEN
    RETURN jsonb_build_object('next', 'resume', 'kind', v.provider_kind, 'task_id', v.provider_task_id);
  END IF;
  RETURN jsonb_build_object('next', 'create', 'kind', v.provider_kind);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- The account's shared budget (migration 140): tokens, slots, Retry-After
-- ---------------------------------------------------------------------------------------------

-- Reserve up to p_n tokens of the account's 'read' or 'create' bucket, but only those that exist
-- within p_max_wait_s seconds (NULL: any): a request that would wait longer takes nothing, so
-- refusals never push the next token further out. p_refund gives back tokens reserved before a
-- Retry-After block and not used. "send": sleep wait_s, then (if wait_s > 0) ask token_blocked.
CREATE OR REPLACE FUNCTION recon.take_token(
  p_account text, p_bucket text, p_max_wait_s double precision DEFAULT NULL, p_n integer DEFAULT 1,
  p_refund integer DEFAULT 0
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_tokens double precision;
  v_rate double precision;
  v_blocked double precision;
  v_taken bigint;
  v_next double precision;
BEGIN
  IF p_bucket IS NULL OR p_bucket NOT IN ('read', 'create') OR coalesce(p_n, 0) < 1 THEN
    RETURN jsonb_build_object('next', 'fix_call', 'reason', 'invalid_argument',
      'message', 'take_token needs an account, bucket read or create, and n >= 1');
  END IF;
  WITH b AS (
    SELECT account, bucket, rate_per_s,
           LEAST(burst, tokens + coalesce(p_refund, 0)
                 + GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - stamp)) * rate_per_s) AS refilled,
           GREATEST(0, EXTRACT(EPOCH FROM stamp - clock_timestamp())) AS blocked_s
    FROM provider_limit_buckets WHERE account = p_account AND bucket = p_bucket FOR UPDATE
  ), t AS (
    SELECT *, CASE
        WHEN p_max_wait_s IS NULL THEN p_n
        WHEN blocked_s > p_max_wait_s THEN 0
        ELSE LEAST(p_n, GREATEST(0, floor(refilled + (p_max_wait_s - blocked_s) * rate_per_s)))
      END AS taken
    FROM b
  )
  UPDATE provider_limit_buckets p
  SET tokens = t.refilled - t.taken, stamp = GREATEST(p.stamp, clock_timestamp())
  FROM t WHERE p.account = t.account AND p.bucket = t.bucket
  RETURNING p.tokens, t.rate_per_s, t.blocked_s, t.taken INTO v_tokens, v_rate, v_blocked, v_taken;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('next', 'no_budget', 'reason', 'no_bucket',
      'message', format('account %s has no shared %s budget yet (recon_dagster creates it at start)', p_account, p_bucket));
  END IF;
  IF v_taken = 0 THEN
    v_next := v_blocked + GREATEST(0, 1 - v_tokens) / v_rate;
    RETURN jsonb_build_object('next', 'not_sent',
      'reason', CASE WHEN v_blocked > p_max_wait_s THEN 'blocked_by_retry_after' ELSE 'token_wait' END,
      'retry_in_s', v_next, 'blocked_s', v_blocked, 'tokens', v_tokens, 'rate_per_s', v_rate, 'taken', 0,
      'message', CASE WHEN v_blocked > p_max_wait_s
        THEN format('account %s is blocked by the provider''s Retry-After for %s s', p_account, round(v_blocked::numeric, 1))
        ELSE format('account %s: the next %s token comes in %s s', p_account, p_bucket, round(v_next::numeric, 1)) END);
  END IF;
  -- Token 1 of the v_taken left the balance at tokens + taken - 1.
  RETURN jsonb_build_object('next', 'send', 'wait_s', v_blocked + GREATEST(0, -(v_tokens + v_taken - 1)) / v_rate,
    'taken', v_taken, 'tokens', v_tokens, 'rate_per_s', v_rate, 'blocked_s', v_blocked);
END
$$;

-- After sleeping for a token: is the account now blocked by a Retry-After that came meanwhile?
-- "queue_again": give the token back (take_token's p_refund = 1) and queue behind the block.
CREATE OR REPLACE FUNCTION recon.token_blocked(p_account text, p_bucket text) RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
  v_blocked double precision;
BEGIN
  SELECT GREATEST(0, EXTRACT(EPOCH FROM stamp - clock_timestamp())) INTO v_blocked
  FROM provider_limit_buckets WHERE account = p_account AND bucket = p_bucket;
  v_blocked := coalesce(v_blocked, 0);
  RETURN jsonb_build_object('next', CASE WHEN v_blocked > 0 THEN 'queue_again' ELSE 'send' END, 'blocked_s', v_blocked);
END
$$;

-- One concurrency slot for p_kind: one under the kind's cap, or any while more than p_reserve stay
-- free. Row locks make the account bound exact; the per-kind counts are read without locks, so the
-- share is approximate under contention (fairness, not a provider limit). NULL p_n, p_cap and
-- p_reserve: the account's slot rows and the default share (half, an eighth kept free).
CREATE OR REPLACE FUNCTION recon.take_slot(
  p_account text, p_kind text, p_holder text DEFAULT NULL, p_ttl_s double precision DEFAULT 180,
  p_n integer DEFAULT NULL, p_cap integer DEFAULT NULL, p_reserve integer DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_n integer := p_n;
  v_holder text := coalesce(p_holder, replace(gen_random_uuid()::text, '-', ''));
  v_slot integer;
BEGIN
  IF v_n IS NULL THEN
    SELECT count(*) INTO v_n FROM provider_limit_slots WHERE account = p_account;
  END IF;
  IF v_n = 0 THEN
    RETURN jsonb_build_object('next', 'no_budget', 'reason', 'no_slots',
      'message', format('account %s has no shared concurrency slots (not limited, or recon_dagster has not started)', p_account));
  END IF;
  WITH live AS (
    SELECT count(*) FILTER (WHERE holder IS NULL OR expires_at < clock_timestamp()) AS free,
           count(*) FILTER (WHERE kind = p_kind AND holder IS NOT NULL AND expires_at >= clock_timestamp()) AS mine
    FROM provider_limit_slots WHERE account = p_account AND slot < v_n
  )
  UPDATE provider_limit_slots s
  SET holder = v_holder, kind = p_kind, expires_at = clock_timestamp() + make_interval(secs => p_ttl_s)
  WHERE s.account = p_account AND s.slot = (
    SELECT slot FROM provider_limit_slots, live
    WHERE account = p_account AND slot < v_n AND (holder IS NULL OR expires_at < clock_timestamp())
      AND (live.mine < coalesce(p_cap, GREATEST(1, floor(v_n * 0.5)::integer))
           OR live.free > coalesce(p_reserve, CASE WHEN v_n > 1 THEN GREATEST(1, v_n / 8) ELSE 0 END))
    ORDER BY slot LIMIT 1 FOR UPDATE OF provider_limit_slots SKIP LOCKED)
  RETURNING s.slot INTO v_slot;
  IF v_slot IS NULL THEN
    RETURN jsonb_build_object('next', 'ask_again', 'reason', 'slot_wait', 'retry_in_s', 0.05,
      'message', format('account %s: no concurrency slot is free for %s now', p_account, p_kind));
  END IF;
  RETURN jsonb_build_object('next', 'send', 'slot', v_slot, 'holder', v_holder, 'renew_every_s', p_ttl_s / 3);
END
$$;

-- Push the expiry of the slots these holders hold one TTL out (every third of the TTL while the
-- request runs: a killed process's slots free themselves one TTL after it died).
CREATE OR REPLACE FUNCTION recon.renew_slots(p_account text, p_holders text[], p_ttl_s double precision DEFAULT 180)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_count bigint;
BEGIN
  UPDATE provider_limit_slots SET expires_at = clock_timestamp() + make_interval(secs => p_ttl_s)
  WHERE account = p_account AND holder = ANY(p_holders);
  GET DIAGNOSTICS v_count = ROW_COUNT;
  RETURN jsonb_build_object('next', 'done', 'renewed', v_count);
END
$$;

CREATE OR REPLACE FUNCTION recon.release_slot(p_account text, p_slot integer, p_holder text) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  UPDATE provider_limit_slots SET holder = NULL, kind = NULL, expires_at = 'epoch'
  WHERE account = p_account AND slot = p_slot AND holder = p_holder;
  RETURN jsonb_build_object('next', 'done', 'released', FOUND);
END
$$;

-- The provider answered 429 with Retry-After: nobody on the account sends before then. Every
-- bucket of the account empties and refills from the block's end.
CREATE OR REPLACE FUNCTION recon.record_retry_after(p_account text, p_seconds double precision) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_until timestamptz;
BEGIN
  IF p_seconds IS NULL OR p_seconds <= 0 OR p_seconds = 'Infinity'::double precision THEN
    RETURN jsonb_build_object('next', 'fix_call', 'reason', 'invalid_argument',
      'message', 'record_retry_after needs a positive, finite number of seconds');
  END IF;
  INSERT INTO provider_limit_accounts AS a (account, blocked_until, retry_afters)
  VALUES (p_account, clock_timestamp() + make_interval(secs => p_seconds), 1)
  ON CONFLICT (account) DO UPDATE
    SET blocked_until = GREATEST(a.blocked_until, EXCLUDED.blocked_until),
        retry_afters = a.retry_afters + 1, updated_at = now()
  RETURNING blocked_until INTO v_until;
  UPDATE provider_limit_buckets SET tokens = LEAST(tokens, 0), stamp = GREATEST(stamp, v_until)
  WHERE account = p_account;
  RETURN jsonb_build_object('next', 'wait', 'blocked_until', v_until,
    'retry_in_s', GREATEST(0, EXTRACT(EPOCH FROM v_until - clock_timestamp())));
END
$$;

-- Only the role the app's workers use may call them (and the owner, recon_dagster's role).
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA recon FROM PUBLIC;

DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'recon_app_worker') THEN
    GRANT USAGE ON SCHEMA recon TO recon_app_worker;
    GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA recon TO recon_app_worker;
    GRANT SELECT, INSERT, UPDATE ON upstream_creates, recon_credit_anomaly_keys, provider_limit_accounts,
      provider_limit_buckets, provider_limit_slots TO recon_app_worker;
  END IF;
END
$$;
