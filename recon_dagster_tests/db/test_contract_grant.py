"""The start-up check names a runtime role that cannot call the contract's functions (schema
recon, migration 160): the reconciler's account limiter and credit anomalies call them, so such a
role would fail on its first poll instead of at start."""

from __future__ import annotations

import secrets

import sqlalchemy as sa

from recon_dagster.db.grants import CONTRACT_ROLE, missing_grant


def _as_new_role(engine: sa.Engine, *, member: bool) -> str | None:
    role = f"recon_grants_{secrets.token_hex(3)}"
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            conn.execute(sa.text(f"CREATE ROLE {role}"))
            conn.execute(sa.text(f"GRANT USAGE ON SCHEMA public TO {role}"))
            conn.execute(sa.text(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}"))
            if member:
                conn.execute(sa.text(f"GRANT {CONTRACT_ROLE} TO {role}"))
            conn.execute(sa.text(f"SET LOCAL ROLE {role}"))
            problem = missing_grant(conn)
            return None if problem is None else str(problem)
        finally:
            trans.rollback()  # the role and its grants go with the transaction


def test_a_role_without_the_contract_is_named_with_the_grant_to_run(engine):
    line = _as_new_role(engine, member=False)
    assert line is not None and "\n" not in line
    assert "EXECUTE on the contract's functions" in line and f"GRANT {CONTRACT_ROLE} TO recon_grants_" in line


def test_a_member_of_the_contract_role_with_the_tables_passes(engine):
    assert _as_new_role(engine, member=True) is None
