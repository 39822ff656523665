"""The app's tables on a database that already has them: checked, never changed.

Migration 001 declares the tables and columns of the host app that recon_dagster reads and writes.
On a database with none of those tables (a new, test or demo database) the migrator runs 001 and
creates them. On a database with any of them they are the app's: ``gaps`` compares them with 001,
one line per difference that would break recon_dagster, and the migrator changes nothing of them.

What is compared, per table of 001: the table exists; each of its columns exists with a type of the
same family (``numeric(14,4)`` is satisfied by any numeric or integer type, ``text`` by varchar,
but ``timestamptz`` only by ``timestamp with time zone`` and ``jsonb`` only by ``jsonb``); on a
table recon_dagster inserts into, every NOT NULL column its insert leaves out has a default (the
app's own extra columns included); and ``user_credits`` has a unique key on ``user_id`` alone, which
the refund's ``ON CONFLICT (user_id)`` needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from pglast import ast as _ast

from recon_dagster.db.migration_sql import APP_TABLES, Statement

ast: Any = _ast  # pglast declares every AST field Optional

# The columns each of recon_dagster's INSERTs into an app table sets (reconcile/completion.py,
# db/credits.py); every other NOT NULL column of that table needs a default.
INSERTED_COLUMNS: dict[str, frozenset[str]] = {
    "assets": frozenset({"user_id", "job_id", "asset_type", "storage_key", "url", "is_public", "metadata"}),
    "credit_anomalies": frozenset({"job_id", "user_id", "reason", "amount", "details"}),
    "user_credits": frozenset({"user_id", "subscription_credits", "topup_credits"}),
}

# Type families, by pg_type.typname (001 spells int as int4, boolean as bool, serials by name).
_FAMILIES: dict[str, frozenset[str]] = {
    "numeric": frozenset({"numeric", "int2", "int4", "int8", "float4", "float8"}),
    "integer": frozenset({"int2", "int4", "int8"}),
    "text": frozenset({"text", "varchar", "bpchar"}),
}
_ALIASES = {"serial": "int4", "bigserial": "int8", "smallserial": "int2", "int": "int4", "integer": "int4"}
_SHOWN = {"int4": "integer", "int8": "bigint", "bool": "boolean", "timestamptz": "timestamptz"}


@dataclass(frozen=True)
class Column:
    name: str
    typname: str  # pg_type.typname of the type 001 declares
    insert_needs_default: bool  # NOT NULL, and recon_dagster's insert leaves it out


def _typname(type_name: Any) -> str:
    name: str = type_name.names[-1].sval
    return _ALIASES.get(name, name)


def expected_tables(statements: list[Statement]) -> dict[str, dict[str, Column]]:
    """001's app tables and their columns, read from its CREATE TABLE statements."""
    tables: dict[str, dict[str, Column]] = {}
    for st in statements:
        node: Any = st.node
        if not isinstance(node, ast.CreateStmt) or node.relation.relname not in APP_TABLES:
            continue
        table = node.relation.relname
        inserted = INSERTED_COLUMNS.get(table)
        columns = {}
        for element in node.tableElts or ():
            if isinstance(element, ast.ColumnDef):
                columns[element.colname] = Column(
                    element.colname,
                    _typname(element.typeName),
                    inserted is not None and element.colname not in inserted,
                )
        tables[table] = columns
    return tables


def _compatible(expected: str, actual: str) -> bool:
    family = _FAMILIES.get("integer" if expected in _FAMILIES["integer"] else expected)
    return actual in family if family else actual == expected


def _shown(typname: str) -> str:
    return _SHOWN.get(typname, typname)


_COLUMNS = """
SELECT c.relname AS table_name, a.attname AS column_name, t.typname, format_type(a.atttypid, a.atttypmod) AS shown,
       a.attnotnull AS not_null, (a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '') AS has_default
FROM pg_class c
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
JOIN pg_type t ON t.oid = a.atttypid
WHERE c.oid = to_regclass(%s)
"""

_UNIQUE_ON = """
SELECT EXISTS (
  SELECT 1 FROM pg_index i
  WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indisvalid AND i.indpred IS NULL
    AND i.indnatts = 1 AND i.indkey[0] = (SELECT attnum FROM pg_attribute
                                          WHERE attrelid = i.indrelid AND attname = %s))
"""


def _has_unique(conn: psycopg.Connection, table: str, column: str) -> bool:
    row = conn.execute(_UNIQUE_ON, [table, column]).fetchone()
    return bool(row and row[0])


def present_app_tables(conn: psycopg.Connection) -> list[str]:
    """The app tables (001's) that exist in the connection's schema search path."""
    rows = conn.execute(
        "SELECT t FROM unnest(%s::text[]) AS t WHERE to_regclass(t) IS NOT NULL ORDER BY t",
        [sorted(APP_TABLES)],
    ).fetchall()
    return [r[0] for r in rows]


def gaps(conn: psycopg.Connection, expected: dict[str, dict[str, Column]]) -> list[str]:
    """One line per way the app's tables differ from what recon_dagster reads and writes."""
    out = []
    for table, columns in expected.items():
        rows = conn.execute(_COLUMNS, [table]).fetchall()
        if not rows:
            out.append(f"{table}: table missing (recon_dagster reads {', '.join(columns)})")
            continue
        actual = {r[1]: r for r in rows}
        for name, col in columns.items():
            row = actual.get(name)
            if row is None:
                out.append(
                    f"{table}.{name}: column missing (recon_dagster reads it as {_shown(col.typname)})"
                )
            elif not _compatible(col.typname, row[2]):
                out.append(f"{table}.{name}: {row[3]}, recon_dagster needs {_shown(col.typname)}")
        inserted = INSERTED_COLUMNS.get(table)
        if inserted is not None:
            for name, row in actual.items():
                if name not in inserted and row[4] and not row[5]:
                    out.append(
                        f"{table}.{name}: NOT NULL without a default, and recon_dagster's insert into "
                        f"{table} does not set it"
                    )
        unique = table != "user_credits" or "user_id" not in actual or _has_unique(conn, table, "user_id")
        if not unique:
            out.append(
                "user_credits: no unique index on (user_id) alone; a refund adds to the user's "
                "row with ON CONFLICT (user_id)"
            )
    return out


__all__ = ["INSERTED_COLUMNS", "Column", "expected_tables", "gaps", "present_app_tables"]
