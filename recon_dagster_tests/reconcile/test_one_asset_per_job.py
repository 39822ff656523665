"""One asset per reconciled job and one anomaly per (job, reason), on the app's own tables: with no
unique index of the app's to lean on (the app-shaped database has none on assets or
credit_anomalies), the guarantees come from recon_dagster's writes: the guarded completion, the
job row's lock, the duplicate check, and for anomalies a key table of recon_dagster's own."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from recon_dagster.db import credits
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.migrate import migrate
from recon_dagster.media.base import StoredObject
from recon_dagster.reconcile.completion import Settled, create_asset, settle_completion
from recon_dagster_tests.db.app_shaped import create_app_tables
from recon_dagster_tests.support.factories import make_job, make_user, reserve

KIND = "kie-standard"


@pytest.fixture(params=["app-shaped", "demo"])
def app_db(request: pytest.FixtureRequest, fresh_engine: sa.Engine) -> Iterator[sa.Engine]:
    """The app's tables without a unique index on assets or credit_anomalies (as a live app may
    have them), and the demo database 001 creates (which has both)."""
    if request.param == "app-shaped":
        create_app_tables(fresh_engine)
    migrate(fresh_engine)
    yield fresh_engine


def _row(db: sa.Engine, status: str = "processing") -> jobs_db.JobRow:
    user = make_user(db, sub=100, topup=0)
    job = make_job(db, user, status=status, provider_kind=KIND, provider_task_id="t-1")
    reserve(db, job, user, 10)
    with db.connect() as conn:
        row, _ = jobs_db.load_job_and_reservation(conn, job)
    assert row is not None
    return row


def _obj(row: jobs_db.JobRow, n: int = 0) -> StoredObject:
    key = f"image/{row.id}/{n}.png"
    return StoredObject(key=key, size=10, url=f"file:///m/{key}", sha256="cd" * 32)


def _settle(db: sa.Engine, row: jobs_db.JobRow, n: int = 0) -> Settled:
    with db.begin() as conn:
        return settle_completion(
            conn,
            row,
            output_data={"media": ["x"]},
            provider="kie",
            provider_cost=0.1,
            display_cost=10.0,
            task_id="t-1",
            notify_source="test",
            asset=_obj(row, n),
            provider_kind=KIND,
        )


def _assets(db: sa.Engine, job: uuid.UUID) -> list[str]:
    with db.connect() as conn:
        return list(
            conn.execute(
                sa.text("SELECT storage_key FROM assets WHERE job_id = :j ORDER BY 1"), {"j": str(job)}
            ).scalars()
        )


def _app_asset(conn: sa.Connection, row: jobs_db.JobRow, key: str) -> None:
    conn.execute(
        sa.text(
            "INSERT INTO assets (user_id, job_id, asset_type, storage_key, is_public) VALUES (:u, :j, 'image', :k, true)"
        ),
        {"u": str(row.user_id), "j": str(row.id), "k": key},
    )


def test_a_repeated_asset_insert_for_one_job_adds_nothing(app_db: sa.Engine) -> None:
    row = _row(app_db)
    with app_db.begin() as conn:
        assert create_asset(conn, row, _obj(row, 0), KIND) is True
    with app_db.begin() as conn:
        assert create_asset(conn, row, _obj(row, 1), KIND) is False
        assert create_asset(conn, row, _obj(row, 2), KIND) is False
    assert _assets(app_db, row.id) == [_obj(row, 0).key]


def test_a_repeated_settle_completes_once_with_one_asset(app_db: sa.Engine) -> None:
    row = _row(app_db)
    first, second = _settle(app_db, row, 0), _settle(app_db, row, 1)
    assert (first.won, first.asset_created) == (True, True)
    assert second == Settled(False)
    assert _assets(app_db, row.id) == [_obj(row, 0).key]


@pytest.mark.parametrize("status", ["failed", "cancelled", "completed"])
def test_a_settle_that_loses_its_guard_adds_no_asset(app_db: sa.Engine, status: str) -> None:
    row = _row(app_db)
    with app_db.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET status = :s WHERE id = :j"), {"s": status, "j": str(row.id)})
    assert _settle(app_db, row) == Settled(False)
    assert _assets(app_db, row.id) == []


def test_a_stuck_job_the_app_already_gave_an_asset_gets_no_second(app_db: sa.Engine) -> None:
    row = _row(app_db)
    with app_db.begin() as conn:
        _app_asset(conn, row, "app/own.png")
    settled = _settle(app_db, row)
    assert (settled.won, settled.asset_created) == (True, False)
    assert _assets(app_db, row.id) == ["app/own.png"]


def test_a_job_the_app_gave_two_assets_keeps_both(fresh_engine: sa.Engine) -> None:
    create_app_tables(fresh_engine)  # no unique index: the app may give a job two assets
    migrate(fresh_engine)
    row = _row(fresh_engine)
    with fresh_engine.begin() as conn:
        _app_asset(conn, row, "app/a.png")
        _app_asset(conn, row, "app/b.png")
    settled = _settle(fresh_engine, row)
    assert (settled.won, settled.asset_created) == (True, False)
    assert _assets(fresh_engine, row.id) == ["app/a.png", "app/b.png"]


def _create_asset(db: sa.Engine, row: jobs_db.JobRow) -> bool:
    with db.begin() as conn:
        return create_asset(conn, row, _obj(row), KIND)


@pytest.mark.parametrize("writer", ["settle_completion", "create_asset"])
@pytest.mark.slow
def test_an_asset_the_app_adds_under_the_job_row_lock_meanwhile_is_seen(
    fresh_engine: sa.Engine, writer: str
) -> None:
    """The app holds the job row (its own finalize, not yet committed) and adds an asset without
    completing the job. The settle waits for the row; once the app commits, the settle still wins
    (the job is in flight) and must see that asset: the duplicate check reads a snapshot taken
    after the lock (``lock_job`` as its own statement), not the one from before the wait."""
    create_app_tables(fresh_engine)
    migrate(fresh_engine)
    row = _row(fresh_engine)
    out: list[bool] = []
    write = {
        "settle_completion": lambda: out.append(_settle(fresh_engine, row).asset_created),
        "create_asset": lambda: out.append(_create_asset(fresh_engine, row)),
    }[writer]
    with fresh_engine.connect() as app:  # closed (rolled back) whatever fails below
        tx = app.begin()
        app.execute(sa.text("UPDATE jobs SET progress = 99 WHERE id = :j"), {"j": str(row.id)})
        _app_asset(app, row, "app/own.png")
        settler = threading.Thread(target=write, daemon=True)
        settler.start()
        time.sleep(1.0)  # the settle is waiting for the app's row lock
        assert settler.is_alive()
        tx.commit()
    settler.join(30)
    assert out == [False]  # no asset of ours: the app's is there
    assert _assets(fresh_engine, row.id) == ["app/own.png"]


def _log(db: sa.Engine, job: uuid.UUID | None, reason: str = "extra_reservation") -> bool:
    with db.begin() as conn:
        return credits.log_credit_anomaly(conn, job_id=job, user_id=None, reason=reason, details={"n": 1})


def _anomalies(db: sa.Engine, job: uuid.UUID | None) -> int:
    with db.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM credit_anomalies WHERE job_id IS NOT DISTINCT FROM :j"),
                {"j": None if job is None else str(job)},
            ).scalar()
            or 0
        )


def test_one_anomaly_per_job_and_reason(app_db: sa.Engine) -> None:
    job = uuid.uuid4()
    assert _log(app_db, job) is True
    assert _log(app_db, job) is False
    assert _log(app_db, job, "refund_split_missing") is True
    assert _anomalies(app_db, job) == 2
    # Without a job nothing is deduplicated (as with the app's index: NULLs never conflict).
    assert _log(app_db, None) is True and _log(app_db, None) is True
    assert _anomalies(app_db, None) == 2
    # An anomaly an operator deleted is logged again when the problem recurs.
    with app_db.begin() as conn:
        conn.execute(sa.text("DELETE FROM credit_anomalies WHERE job_id = :j"), {"j": str(job)})
    assert _log(app_db, job) is True


def test_an_anomaly_already_in_the_apps_table_is_not_repeated(app_db: sa.Engine) -> None:
    job = uuid.uuid4()
    with app_db.begin() as conn:  # written before migration 145, or by the app
        conn.execute(
            sa.text("INSERT INTO credit_anomalies (job_id, reason) VALUES (:j, 'extra_reservation')"),
            {"j": str(job)},
        )
    assert _log(app_db, job) is False
    assert _anomalies(app_db, job) == 1


@pytest.mark.slow
def test_two_writers_of_one_anomaly_at_once_log_it_once(fresh_engine: sa.Engine) -> None:
    create_app_tables(fresh_engine)  # no unique index on credit_anomalies
    migrate(fresh_engine)
    job = uuid.uuid4()
    out: list[bool] = []
    with fresh_engine.connect() as first:  # closed (rolled back) whatever fails below
        tx = first.begin()
        assert credits.log_credit_anomaly(first, job_id=job, user_id=None, reason="extra_reservation") is True
        second = threading.Thread(target=lambda: out.append(_log(fresh_engine, job)), daemon=True)
        second.start()
        time.sleep(1.0)
        assert second.is_alive()  # waiting for the first writer's claim
        tx.commit()
    second.join(30)
    assert out == [False]
    assert _anomalies(fresh_engine, job) == 1
