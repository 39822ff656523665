"""A job whose worker kept the contract only through the SQL functions (plain psycopg, no library:
what a Node worker does) is owned, attributed, explained and recovered exactly like one whose
worker used the Python library: the reconciler, the orphan sweep, spend and explain read the rows
the functions write, whoever called them."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import dagster as dg
import psycopg
import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import get_kind
from recon_dagster.db import ledger
from recon_dagster.db.spend import owners
from recon_dagster.operator.explain import load_story
from recon_dagster.providers import ProvidersResource, providers_from_env
from recon_dagster.reconcile.app_worker import JobNoLongerInFlight, make_on_task_created
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.factories import balances, job_row, make_job, reserve
from recon_dagster_tests.support.orphans import actions, sweep
from recon_dagster_tests.support.reconcile import make_defs, tick, usage_status

KIND = "replicate-prediction"
PROVIDER = str(get_kind(KIND).provider)
RUNNING = Scenario(outcome="run_forever")
PAYLOAD = {"version": "v1", "input": {"prompt": "a lighthouse at dusk"}}


@pytest.fixture
def providers(sandbox: SandboxServer) -> Iterator[ProvidersResource]:
    sandbox.reset()
    with contextlib.closing(providers_from_env()) as res:
        yield res


def sql_worker(db: sa.Engine, job: uuid.UUID, task_id: str) -> dict[str, Any]:
    """A worker in another language: the intent, then the answer, each one SQL call of its own."""
    url = db.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as pg:
        intent = pg.execute(
            "SELECT recon.create_intent(%s, %s, %s, %s)", (job, PROVIDER, KIND, ledger.fingerprint(PAYLOAD))
        ).fetchone()
        assert intent is not None and intent[0]["next"] == "send"
        answer = pg.execute(
            "SELECT recon.create_answered(%s, %s, %s, %s, %s)",
            (job, PROVIDER, KIND, task_id, intent[0]["create_id"]),
        ).fetchone()
    assert answer is not None
    return dict(answer[0])


def library_worker(db: sa.Engine, job: uuid.UUID, task_id: str) -> None:
    """The Python library's create hook, as a provider's ``run`` drives it."""
    hook = make_on_task_created(job, KIND, engine=db)
    hook.before_send(PROVIDER, KIND, PAYLOAD, True)
    hook(task_id)


def creates(db: sa.Engine, job: uuid.UUID) -> list[tuple[Any, ...]]:
    with db.connect() as conn:
        return [
            (c.seq, c.provider_kind, c.state, c.marker_sent, c.fate) for c in ledger.creates_of_job(conn, job)
        ]


def test_the_orphan_sweep_owns_spend_attributes_and_explain_tells_a_function_written_task_like_the_librarys(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    by_sql, by_lib, unknown = (sandbox.add_task(KIND, RUNNING) for _ in range(3))
    job_sql = make_job(db, user, job_type="image", status="processing")
    job_lib = make_job(db, user, job_type="image", status="processing")
    assert sql_worker(db, job_sql, by_sql) == {
        "next": "poll",
        "task_id": by_sql,
        "create_id": str(ledger.create_id(job_sql, 1)),
    }
    library_worker(db, job_lib, by_lib)

    report = sweep(db, providers)

    assert actions(report) == {by_sql: "owned", by_lib: "owned", unknown: "unknown"}
    assert creates(db, job_sql) == creates(db, job_lib)
    with db.connect() as conn:
        assert owners(conn, PROVIDER, {by_sql, by_lib, unknown}) == {by_sql: job_sql, by_lib: job_lib}
    told_sql, told_lib = load_story(db, job_sql), load_story(db, job_lib)
    assert (told_sql.provider_kind, told_sql.provider_task_id) == (KIND, by_sql)
    assert [e.line(told_sql.provider_task_id) for e in told_sql.creates] == [
        e.line(told_lib.provider_task_id).replace(by_lib, by_sql) for e in told_lib.creates
    ]


def test_a_late_task_id_written_through_the_function_is_cancelled_as_ours_like_the_librarys(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    by_sql, by_lib = sandbox.add_task(KIND, RUNNING), sandbox.add_task(KIND, RUNNING)
    job_sql = make_job(db, user, job_type="image", status="failed")
    job_lib = make_job(db, user, job_type="image", status="failed")
    answer = sql_worker(db, job_sql, by_sql)
    assert (answer["next"], answer["reason"], answer["status"]) == ("stop", "job_not_in_flight", "failed")
    with pytest.raises(JobNoLongerInFlight):
        library_worker(db, job_lib, by_lib)

    report = sweep(db, providers)

    assert actions(report) == {by_sql: "cancel", by_lib: "cancel"}
    assert sandbox.task_info(by_sql)["canceled"] is True
    assert creates(db, job_sql) == creates(db, job_lib)
    assert load_story(db, job_sql).anomalies[0].reason == "upstream_task_for_ended_job"


def test_the_reconciler_recovers_a_job_whose_task_id_only_the_function_wrote(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance, media_dir: str,
) -> None:  # fmt: skip
    task = sandbox.add_task(KIND, Scenario(polls_before_done=0))
    job = make_job(db, user, job_type="image", status="processing")
    reserve(db, job, user, 30)
    assert sql_worker(db, job, task)["next"] == "poll"
    with db.begin() as conn:  # the worker died; its call is now past the kind's threshold
        conn.execute(
            sa.text(
                "UPDATE jobs SET provider_call_started_at = now() - make_interval(secs => :s) WHERE id = :j"
            ),
            {"s": (get_kind(KIND).stale_threshold + timedelta(minutes=5)).total_seconds(), "j": str(job)},
        )

    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "completed"
    assert usage_status(db, job) == "committed"
    assert balances(db, user) == (Decimal(70), Decimal(50))  # charged once
    assert sandbox.create_count() == 0  # recovered from the task the function wrote, never re-created
