"""What the runtime role needs on the app's database, and the start-up check naming what it lacks.

Two roles (docs/deploying.md#roles-and-grants, ``deploy/roles.sql``): the **owner** runs
``recon-dagster migrate`` (it must own ``jobs``, which migrate alters and indexes), and the
**runtime** role the code server, daemon, run workers and operator commands use, which needs only
the privileges below. A runtime role granted before migrate creates a table reads it through the
owner's default privileges; one that lacks a grant fails at start with one line naming it (the
grant to run), never later as "fix the migration".
"""

from __future__ import annotations

import sqlalchemy as sa

# The app's tables: exactly what recon_dagster reads and writes there.
APP_TABLES: dict[str, tuple[str, ...]] = {
    "jobs": ("SELECT", "UPDATE"),
    "usage_logs": ("SELECT", "UPDATE"),
    "user_credits": ("SELECT", "INSERT", "UPDATE"),
    "assets": ("SELECT", "INSERT"),
    "credit_anomalies": ("SELECT", "INSERT"),
    "workflow_executions": ("SELECT", "UPDATE"),
    "characters": ("SELECT", "UPDATE"),
}
# The tables migrate creates for recon_dagster itself (the owner's default privileges grant these).
OWN_TABLES: dict[str, tuple[str, ...]] = {
    name: ("SELECT", "INSERT", "UPDATE", "DELETE")
    for name in (
        "reconcile_events",
        "reconcile_decisions",
        "provider_poll_answers",
        "provider_limit_accounts",
        "provider_limit_buckets",
        "provider_limit_slots",
        "recon_credit_anomaly_keys",
        "upstream_creates",
        "recon_pruned_jobs",
        "recon_balance_samples",
    )
}
READ_ONLY: dict[str, tuple[str, ...]] = {
    "recon_schema_migrations": ("SELECT",),
    "recon_schema_contract": ("SELECT",),
}
# The app workers' contract (migration 160): the reconciler's account limiter and credit anomalies
# call these functions too; migrate grants them to this role, and the runtime role is its member.
CONTRACT_ROLE = "recon_app_worker"
# Read from the catalogs: naming the function would need the schema's USAGE, the thing checked.
_CONTRACT_CHECK = """
SELECT coalesce(bool_and(has_schema_privilege(current_user, n.oid, 'USAGE')
                         AND has_function_privilege(current_user, p.oid, 'EXECUTE')), true)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'recon' AND p.proname = 'contract_version'
"""
RUNTIME: dict[str, tuple[str, ...]] = {**APP_TABLES, **OWN_TABLES, **READ_ONLY}

DOC = "docs/deploying.md#roles-and-grants"

_CHECK = """
SELECT x.name, p.priv,
       CASE WHEN to_regclass(x.name) IS NULL THEN true
            ELSE has_table_privilege(current_user, x.name, p.priv) END AS granted
FROM unnest(CAST(:names AS text[]), CAST(:privs AS text[])) AS x(name, privs)
CROSS JOIN LATERAL unnest(string_to_array(x.privs, ',')) AS p(priv)
"""


class MissingGrant(RuntimeError):
    """The runtime role lacks a privilege recon_dagster needs: ``what`` names it, ``fix`` the GRANT
    to run; the message is both, one line."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(f"{what}; {fix}")
        self.what = what
        self.fix = fix


def missing_grants(conn: sa.Connection) -> list[tuple[str, str]]:
    """(privilege, table) pairs the current role lacks, for the tables that exist."""
    names = list(RUNTIME)
    privs = [",".join(RUNTIME[n]) for n in names]
    rows = conn.execute(sa.text(_CHECK), {"names": names, "privs": privs}).all()
    return [(r.priv, r.name) for r in rows if not r.granted]


def missing_grant(conn: sa.Connection) -> MissingGrant | None:
    """What the current role lacks and the GRANT that fixes it (one line); None: nothing."""
    missing = missing_grants(conn)
    role = conn.execute(sa.text("SELECT current_user")).scalar_one()
    if not conn.execute(sa.text(_CONTRACT_CHECK)).scalar_one():
        return MissingGrant(
            f"role {role} lacks EXECUTE on the contract's functions (schema recon)",
            f"run GRANT {CONTRACT_ROLE} TO {role} as migrate's role ({DOC})",
        )
    if not missing:
        return None
    by_table: dict[str, list[str]] = {}
    for priv, table in missing:
        by_table.setdefault(table, []).append(priv)
    grants = "; ".join(f"GRANT {', '.join(p)} ON {t} TO {role}" for t, p in by_table.items())
    owned = [t for t in by_table if t in OWN_TABLES or t in READ_ONLY]
    default = (
        " (tables migrate creates: ALTER DEFAULT PRIVILEGES FOR ROLE <migrate's role> ... TO "
        f"{role}, deploy/roles.sql)"
        if owned
        else ""
    )
    lacks = ", ".join(f"{'/'.join(p)} on {t}" for t, p in by_table.items())
    return MissingGrant(f"role {role} lacks {lacks}", f"run {grants}{default} as the tables' owner ({DOC})")


def check_grants(conn: sa.Connection) -> None:
    """Raise ``MissingGrant`` (one line) when the current role lacks a privilege it needs."""
    problem = missing_grant(conn)
    if problem is not None:
        raise problem
