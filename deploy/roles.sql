-- Two roles for recon_dagster on the app's database (docs/deploying.md#roles-and-grants).
--
-- recon_owner   runs `recon-dagster migrate` (RECON_MIGRATE_DATABASE_URL). migrate adds columns
--               and indexes to the app's `jobs` (and indexes to usage_logs, characters), which
--               only their owner may do: make it the role that owns the app's tables, or a member
--               of it (GRANT <app owner> TO recon_owner). It creates recon_dagster's own tables.
-- recon_runtime the code server, daemon, run workers and operator commands (RECON_DATABASE_URL):
--               read and write the rows recon_dagster settles, nothing else, no DDL.
--
-- Run once as a superuser or the app tables' owner, in the app's database, before the first
-- migrate (running it again changes nothing). Replace the role names and the password; tested by
-- recon_dagster_tests/db/test_roles.py, which runs this file as it is but for the names.

CREATE ROLE recon_runtime LOGIN PASSWORD 'change-me';

DO $$ BEGIN
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO recon_runtime', current_database());
END $$;
GRANT USAGE ON SCHEMA public TO recon_runtime;

-- The app's tables: exactly what recon_dagster reads and writes (recon_dagster/db/grants.py).
GRANT SELECT, UPDATE ON jobs, usage_logs, workflow_executions, characters TO recon_runtime;
GRANT SELECT, INSERT, UPDATE ON user_credits TO recon_runtime;
GRANT SELECT, INSERT ON assets, credit_anomalies TO recon_runtime;

-- recon_dagster's own tables, those migrate creates later included: the owner's default privileges.
ALTER DEFAULT PRIVILEGES FOR ROLE recon_owner IN SCHEMA public
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO recon_runtime;
ALTER DEFAULT PRIVILEGES FOR ROLE recon_owner IN SCHEMA public
  GRANT USAGE, SELECT ON SEQUENCES TO recon_runtime;

-- Those an earlier migrate already created (none on a first install).
DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['reconcile_events', 'reconcile_decisions', 'provider_poll_answers',
      'provider_limit_accounts', 'provider_limit_buckets', 'provider_limit_slots',
      'recon_credit_anomaly_keys', 'upstream_creates', 'recon_pruned_jobs', 'recon_balance_samples', 'recon_schema_contract'] LOOP
    IF to_regclass(t) IS NOT NULL THEN
      EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO recon_runtime', t);
    END IF;
  END LOOP;
  IF to_regclass('recon_schema_migrations') IS NOT NULL THEN
    GRANT SELECT ON recon_schema_migrations TO recon_runtime;
  END IF;
  EXECUTE 'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO recon_runtime';
END $$;

-- The reconciler keeps the app workers' contract too (the account limiter and credit anomalies call
-- the functions of schema recon, migration 160): the runtime role is a member of the role migrate
-- grants them to. Run after the first migrate (the role is migrate's).
DO $$ BEGIN
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'recon_app_worker') THEN
    GRANT recon_app_worker TO recon_runtime;
  END IF;
END $$;
