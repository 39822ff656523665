"""A database shaped like a live app's, for the migration tests and the migration benchmark: the
app's tables as the app has them (types a little different from 001's, its own indexes and
columns, no unique index on assets or credit_anomalies), never created by recon_dagster."""

from __future__ import annotations

import sqlalchemy as sa

from recon_dagster.db.migrate import BASELINE_VERSION, discover

# The app's own differences from 001: other (compatible) types, extra columns, its own indexes.
APP_DIFFERENCES = (
    "ALTER TABLE jobs ALTER COLUMN job_type TYPE varchar(64)",
    "ALTER TABLE jobs ALTER COLUMN progress TYPE smallint",
    "ALTER TABLE jobs ADD COLUMN priority int NOT NULL DEFAULT 0",
    "CREATE INDEX jobs_status_created_idx ON jobs (status, created_at)",
    "CREATE INDEX assets_job_idx ON assets (job_id)",
    "ALTER TABLE assets ADD COLUMN width int",
    "CREATE INDEX credit_anomalies_job_idx ON credit_anomalies (job_id)",
)


def create_app_tables(engine: sa.Engine) -> None:
    """001's CREATE TABLEs as the app ran them (none of 001's indexes), then the app's differences."""
    base = next(m for m in discover() if m.version == BASELINE_VERSION)
    with engine.begin() as conn:
        for st in base.statements:
            if st.creates_table:
                conn.exec_driver_sql(st.text)
        for statement in APP_DIFFERENCES:
            conn.exec_driver_sql(statement)


def app_schema(engine: sa.Engine) -> dict[str, list[tuple]]:
    """The app tables' indexes and constraints, schema names left out."""
    with engine.connect() as conn:
        schema = conn.execute(sa.text("SELECT current_schema()")).scalar()
        indexes = conn.execute(
            sa.text(
                "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                "AND tablename = ANY(:t) ORDER BY 1, 2"
            ),
            {"t": list(APP_TABLE_NAMES)},
        ).all()
        constraints = conn.execute(
            sa.text(
                "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE connamespace = current_schema()::regnamespace AND conrelid::regclass::text = ANY(:t) "
                # PostgreSQL 18 lists NOT NULL here too: a property of a column (135's
                # reconcile_attempts is NOT NULL by the spec), compared with the columns.
                "AND contype <> 'n' ORDER BY 1, 2"
            ),
            {"t": list(APP_TABLE_NAMES)},
        ).all()
    strip = f"{schema}."
    return {
        "indexes": [tuple(str(v).replace(strip, "") for v in r) for r in indexes],
        "constraints": [tuple(str(v).replace(strip, "") for v in r) for r in constraints],
    }


APP_TABLE_NAMES = (
    "user_credits",
    "workflow_executions",
    "jobs",
    "usage_logs",
    "assets",
    "credit_anomalies",
    "characters",
)
