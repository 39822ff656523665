"""Which releases may run against a schema: the schema's contract, checked when a process first
connects.

Migrations are applied before a release rolls out (migrate first, then roll), so during a deploy
the previous release's code location, daemon and the app's workers run against a schema the new
release migrated. That works while every migration only adds (a table, a nullable column, an
index, a row) and keeps what the older code reads and writes. Migration 165 records, in
``recon_schema_contract``, the contract the schema was migrated to and the oldest release contract
it still serves. A release speaks ``CONTRACT``; when the schema's ``oldest_reader`` is newer (a
later migration removed or changed what this release uses), this release refuses the database
with one line at its first connection, before it reads or writes a row. A schema without the
table or the row (migrations before 165 only, or a test that emptied it) is not refused: the
missing tables themselves then say to run ``recon-dagster migrate``. docs/deploying.md says which
releases may run side by side.
"""

from __future__ import annotations

from typing import Any

# The contract this release speaks: 1 = every release up to 0.2.0 (no check), 2 = from the
# release that added migration 165. Raise it, and oldest_reader in a migration, only together with
# a migration that an older release cannot run against.
CONTRACT = 2
TABLE = "recon_schema_contract"


FIX = "deploy a newer release of recon_dagster (docs/deploying.md#which-releases-may-run-side-by-side)"


class SchemaContractError(RuntimeError):
    """This release may not run against the database's schema: one line, what and what to do."""

    def __init__(self, what: str, fix: str = FIX) -> None:
        super().__init__(f"{what}; {fix}")
        self.what, self.fix = what, fix


def refusal(contract: int, oldest_reader: int, *, speaks: int = CONTRACT) -> str | None:
    """What is wrong when a schema of ``contract`` serving readers from ``oldest_reader`` on is
    asked to serve a release speaking ``speaks``; None when it may."""
    if speaks >= oldest_reader:
        return None
    return (
        f"the database's schema (contract {contract}) no longer serves this release (contract {speaks}), "
        f"only contract {oldest_reader} and later"
    )


def check_dbapi(dbapi_connection: Any) -> None:
    """Raise ``SchemaContractError`` when the schema refuses this release; read on a raw DB-API
    connection (the engine's first connect), leaving it as it found it."""
    cur = dbapi_connection.cursor()
    try:
        cur.execute(f"SELECT to_regclass('{TABLE}') IS NOT NULL")
        row = cur.fetchone()
        if row and row[0]:
            cur.execute(f"SELECT contract, oldest_reader FROM {TABLE}")
            found = cur.fetchone()
            if found is not None:
                message = refusal(int(found[0]), int(found[1]))
                if message:
                    raise SchemaContractError(message)
    finally:
        cur.close()
        dbapi_connection.rollback()
