"""The stale scan is served by jobs_inflight_idx, not a scan of the whole jobs table."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from recon_dagster.core.kinds import KINDS
from recon_dagster.db.jobs import scan_stale, stale_scan_sql
from recon_dagster_tests.support.factories import bulk_jobs
from recon_dagster_tests.support.plans import index_of, plan_nodes


def _explain(conn: sa.Connection) -> list[dict[str, Any]]:
    raw = conn.execute(sa.text("EXPLAIN (FORMAT JSON) " + stale_scan_sql()), {"limit": 500}).scalar_one()
    plan = raw if isinstance(raw, list) else json.loads(raw)
    return plan_nodes(plan[0]["Plan"])


def test_stale_scan_uses_the_inflight_index(db: sa.Engine) -> None:
    bulk_jobs(db, 5000, inflight_fraction=0.01, legacy_inflight=20)
    with db.begin() as conn:
        conn.exec_driver_sql("ANALYZE jobs")
        nodes = _explain(conn)
        on_jobs = [n for n in nodes if n.get("Relation Name") == "jobs"]
        assert on_jobs, "the plan reads no jobs relation at all"
        for node in on_jobs:
            assert index_of(node) == "jobs_inflight_idx", (node["Node Type"], node.get("Index Name"))
        # The fill really has stale rows, and the scan finds them (the plan is of a live query).
        assert scan_stale(conn, limit=500)


def test_stale_scan_ignores_finished_rows_however_old(db: sa.Engine) -> None:
    bulk_jobs(db, 2000, inflight_fraction=0.0)
    with db.begin() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar_one() == 2000
        assert scan_stale(conn, limit=500) == []


def test_the_plan_check_sees_a_sequential_scan(db: sa.Engine) -> None:
    # Guards the check above: with index scans disabled the same inspection must report no index.
    bulk_jobs(db, 2000, legacy_inflight=20)
    with db.begin() as conn:
        conn.exec_driver_sql("ANALYZE jobs")
        conn.exec_driver_sql("SET LOCAL enable_indexscan = off")
        conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
        on_jobs = [n for n in _explain(conn) if n.get("Relation Name") == "jobs"]
        assert on_jobs
        assert {index_of(n) for n in on_jobs} == {None}


def test_bulk_fill_has_the_documented_shape(db: sa.Engine) -> None:
    bulk_jobs(db, 10_000, inflight_fraction=0.01, legacy_inflight=7)
    with db.connect() as conn:
        shape = conn.execute(
            sa.text(
                """
                SELECT count(*) AS total,
                       count(*) FILTER (WHERE status IN ('pending', 'processing')) AS inflight,
                       count(*) FILTER (WHERE status IN ('pending', 'processing') AND provider_kind IS NULL)
                         AS legacy_inflight,
                       count(*) FILTER (WHERE provider_kind IS NULL AND provider_call_started_at IS NOT NULL)
                         AS legacy_with_call_time,
                       count(*) FILTER (WHERE provider_kind IS NULL) AS legacy,
                       count(DISTINCT provider_kind) AS kinds
                FROM jobs
                """
            )
        ).one()
    assert shape.total == 10_007
    assert 60 <= shape.inflight - 7 <= 140  # about 1% of 10,000
    assert shape.legacy_inflight == 7
    assert shape.legacy_with_call_time == 0
    assert 400 <= shape.legacy <= 950  # about one finished row in 15
    assert shape.kinds == len(KINDS)
