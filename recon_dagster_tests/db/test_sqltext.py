"""The statements a reconciled job sends are clauses built once per SQL text and reused, not
rebuilt at every call (``recon_dagster.db.sqltext.sql``): real PostgreSQL, the loopback sandbox."""

from __future__ import annotations

import uuid
from collections import defaultdict

import sqlalchemy as sa

from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.reconciler import Reconciler, ReconcileSettings
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import finished_kie_job


def _lease(db: sa.Engine, job: uuid.UUID, owner: str) -> None:
    with db.begin() as conn:
        conn.exec_driver_sql(  # driver SQL: not a clause, so not among the ones counted
            "UPDATE jobs SET reconcile_lease_owner = %(o)s, "
            "reconcile_lease_expires_at = now() + interval '5 minutes' WHERE id = %(j)s",
            {"o": owner, "j": str(job)},
        )


def test_every_statement_of_a_job_is_a_clause_built_once_per_text(db, sandbox, media_dir) -> None:
    user = make_user(db, sub=100, topup=0)
    jobs = [finished_kie_job(db, sandbox, user)[0] for _ in range(3)]
    for _ in range(3):  # failed upstream: fail + refund
        task = sandbox.add_task("kie-standard", Scenario(outcome="fail", polls_before_done=0))
        job = make_job(db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=11)
        reserve(db, job, user, 2)
        jobs.append(job)
    sent: dict[str, list[sa.TextClause]] = defaultdict(list)  # the objects are kept: ids stay unique

    def record(_conn, clause, *_args) -> None:
        if isinstance(clause, sa.TextClause):
            sent[clause.text].append(clause)

    sa.event.listen(db, "before_execute", record)
    try:
        rec = Reconciler(
            db, providers_from_env(), LocalMediaStore(base_dir=media_dir), settings=ReconcileSettings()
        )
        for job in jobs:  # one at a time: each job's statements are sent by its own calls
            owner = f"run-{uuid.uuid4().hex[:8]}"
            _lease(db, job, owner)
            assert rec.reconcile(job, owner).outcome.value in ("recovered", "failed")
    finally:
        sa.event.remove(db, "before_execute", record)
    repeated = {text: clauses for text, clauses in sent.items() if len(clauses) >= 3}
    assert len(repeated) >= 5, sorted(t[:60] for t in sent)  # lease, complete, credits, asset, fail...
    rebuilt = {
        " ".join(t.split())[:90]: len({id(c) for c in cs})
        for t, cs in repeated.items()
        if len({id(c) for c in cs}) > 1
    }
    assert rebuilt == {}, f"clauses rebuilt at every call: {rebuilt}"
