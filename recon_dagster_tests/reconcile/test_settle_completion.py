"""``settle_completion``: the won completion's three writes (the guarded completion, the credit
commit, the asset) as one statement. It must write exactly what ``complete_job``, then
``commit_job_credits`` and ``create_asset`` wrote in one transaction, in every case: checked here
case by case against that sequence on two identical rows, on real PostgreSQL."""

from __future__ import annotations

import itertools
import uuid
from decimal import Decimal as D
from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.db import credits
from recon_dagster.db import jobs as jobs_db
from recon_dagster.media.base import StoredObject
from recon_dagster.reconcile.completion import Settled, create_asset, settle_completion
from recon_dagster_tests.support.factories import balances, make_job, make_user, nan_reservation, reserve

KIND = "kie-standard"


def _setup(db: sa.Engine, status: str, row_task: str | None, reserved: int, nan: bool) -> tuple:
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user, status=status, provider_kind=KIND, provider_task_id=row_task, is_public=None)
    for i in range(reserved):
        reserve(db, job, user, 5 + i, from_sub=3 + i, from_topup=2)
    if nan:
        nan_reservation(db, job, user)
    with db.connect() as conn:
        row, _ = jobs_db.load_job_and_reservation(conn, job)
    assert row is not None
    return user, row


def _obj(row: jobs_db.JobRow) -> StoredObject:
    key = f"image/{row.id}/0.png"
    return StoredObject(key=key, size=1234, url=f"file:///media/{key}", sha256="ab" * 32)


def _args(task: str | None) -> dict[str, Any]:
    return {
        "output_data": {"media": ["x"], "source": "test"},
        "provider": "kie",
        "provider_cost": 0.25,
        "display_cost": 5.0,
        "task_id": task,
        "notify_source": "test",
    }


def _three_statements(db: sa.Engine, row: jobs_db.JobRow, task: str | None, asset: bool) -> Settled:
    """What finalize's settle sent before: three statements in one transaction."""
    with db.begin() as conn:
        if not jobs_db.complete_job(conn, row.id, **_args(task)):
            return Settled(False)
        committed = credits.commit_job_credits(conn, row.id, 0.25)
        created = create_asset(conn, row, _obj(row), KIND) if asset else False
        return Settled(True, committed, created)


def _one_statement(db: sa.Engine, row: jobs_db.JobRow, task: str | None, asset: bool) -> Settled:
    with db.begin() as conn:
        return settle_completion(
            conn, row, **_args(task), asset=_obj(row) if asset else None, provider_kind=KIND
        )


def _state(db: sa.Engine, user: uuid.UUID, row: jobs_db.JobRow, settled: Settled) -> dict[str, Any]:
    """Everything the settle may have written, without ids that differ between the two rows."""
    with db.connect() as conn:
        job = conn.execute(
            sa.text(
                "SELECT status, output_data, provider, provider_cost, display_cost, progress,"
                " error_message, completed_at IS NOT NULL AS done, reconcile_lease_owner"
                " FROM jobs WHERE id = :j"
            ),
            {"j": str(row.id)},
        ).one()
        logs = conn.execute(
            sa.text(
                "SELECT id, status, amount::text, provider_cost_usd, settled_at IS NOT NULL AS settled"
                " FROM usage_logs WHERE job_id = :j ORDER BY created_at, id"
            ),
            {"j": str(row.id)},
        ).all()
        anomalies = conn.execute(
            sa.text("SELECT reason FROM credit_anomalies WHERE job_id = :j ORDER BY reason"),
            {"j": str(row.id)},
        ).all()
        assets = conn.execute(
            sa.text(
                "SELECT asset_type, storage_key = :k AS own_key, url, is_public, metadata"
                " FROM assets WHERE job_id = :j"
            ),
            {"j": str(row.id), "k": _obj(row).key},
        ).all()
    committed_index = next((i for i, log in enumerate(logs) if log.id == settled.usage_log_id), None)
    return {
        "returned": (settled.won, committed_index, settled.asset_created),
        "job": tuple(job),
        "logs": [tuple(log)[1:] for log in logs],
        "balances": balances(db, user),
        "anomalies": [a.reason for a in anomalies],
        "assets": [
            (a.asset_type, a.own_key, a.url.replace(str(row.id), "ID"), a.is_public, a.metadata)
            for a in assets
        ],
    }


CASES = list(
    itertools.product(
        ("processing", "pending", "completed", "failed", "cancelled"),  # the row's status
        (None, "t-1"),  # the row's task
        (None, "t-1", "t-2"),  # the result's task
        (0, 1, 2),  # valid reservations
        (False, True),  # and a NaN one
        (True, False),  # media to record as the asset
    )
)


@pytest.mark.slow
@pytest.mark.parametrize(("status", "row_task", "task", "reserved", "nan", "asset"), CASES)
def test_one_statement_writes_what_the_three_wrote(db, status, row_task, task, reserved, nan, asset):
    user_a, row_a = _setup(db, status, row_task, reserved, nan)
    user_b, row_b = _setup(db, status, row_task, reserved, nan)

    before = _state(db, user_a, row_a, Settled(False))
    expected = _state(db, user_a, row_a, _three_statements(db, row_a, task, asset))
    got = _state(db, user_b, row_b, _one_statement(db, row_b, task, asset))

    assert got == expected
    if not expected["returned"][0]:  # a lost completion writes nothing at all
        assert got == before


def test_the_common_case_is_the_row_lock_then_one_statement_and_settles_everything(db):
    user, row = _setup(db, "processing", "t-1", 1, False)
    sent: list[str] = []

    def count(conn, cursor, statement, *args):
        sent.append(statement)

    sa.event.listen(db, "before_cursor_execute", count)
    try:
        settled = _one_statement(db, row, "t-1", True)
    finally:
        sa.event.remove(db, "before_cursor_execute", count)
    # The job row's lock first, as a statement of its own (the asset's duplicate check then reads a
    # snapshot taken after it), then the one settle statement.
    assert len(sent) == 2, sent
    assert sent[0].startswith("SELECT id FROM jobs WHERE id = ") and sent[0].endswith("FOR UPDATE")
    assert settled.won and settled.usage_log_id is not None and settled.asset_created
    state = _state(db, user, row, settled)
    assert state["job"][0] == "completed"
    assert [log[0] for log in state["logs"]] == ["committed"] and state["logs"][0][2] == D("0.25")
    assert state["assets"] and state["assets"][0][1] is True
    assert state["anomalies"] == []
