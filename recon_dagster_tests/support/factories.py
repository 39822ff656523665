"""Plain functions that put rows in the test database the way the host app would.

Each takes an engine (or a connection, to share the caller's transaction) and returns ids or values.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

import sqlalchemy as sa

from recon_dagster.core.types import JobRow
from recon_dagster.db.credits import record_reservation, reserve_credits_for_job

Bind = sa.Engine | sa.Connection
T = TypeVar("T")


def _run(bind: Bind, fn: Callable[[sa.Connection], T]) -> T:
    """Run ``fn(conn)`` in the caller's connection, or in a fresh transaction of an engine."""
    if isinstance(bind, sa.Connection):
        return fn(bind)
    with bind.begin() as conn:
        return fn(conn)


def make_user(bind: Bind, sub: float | Decimal = 100, topup: float | Decimal = 50) -> uuid.UUID:
    """A user with ``sub`` subscription credits and ``topup`` top-up credits."""
    user_id = uuid.uuid4()
    _run(
        bind,
        lambda conn: conn.execute(
            sa.text(
                "INSERT INTO user_credits (user_id, subscription_credits, topup_credits) VALUES (:u, :s, :t)"
            ),
            {"u": str(user_id), "s": Decimal(str(sub)), "t": Decimal(str(topup))},
        ),
    )
    return user_id


def make_job(
    bind: Bind,
    user_id: uuid.UUID,
    *,
    job_type: str = "image",
    status: str = "processing",
    provider_kind: str | None = None,
    provider_task_id: str | None = None,
    started_minutes_ago: float | None = None,
    reconcile_attempts: int = 0,
    should_watermark: bool = False,
    is_public: bool | None = None,
    workflow_execution_id: uuid.UUID | None = None,
    node_id: str | None = None,
    input_data: dict[str, Any] | None = None,
    created_minutes_ago: float | None = None,
) -> uuid.UUID:
    """A jobs row; ``started_minutes_ago`` sets ``provider_call_started_at = now() - interval``.

    ``created_minutes_ago`` back-dates ``created_at`` (legacy rows with no provider call time are
    aged by it). ``started_at`` is left NULL: it is the worker's dequeue time, not ours to invent.
    """

    def insert(conn: sa.Connection) -> uuid.UUID:
        row = conn.execute(
            sa.text(
                """
                INSERT INTO jobs (user_id, job_type, status, input_data, should_watermark, is_public,
                  workflow_execution_id, node_id, provider_kind, provider_task_id,
                  provider_call_started_at, reconcile_attempts, created_at)
                VALUES (:user_id, :job_type, :status, CAST(:input_data AS jsonb), :should_watermark,
                  :is_public, :workflow_execution_id, :node_id, :provider_kind, :provider_task_id,
                  CASE WHEN CAST(:minutes AS float8) IS NULL THEN NULL
                       ELSE now() - make_interval(secs => CAST(:minutes AS float8) * 60) END,
                  :reconcile_attempts,
                  now() - make_interval(secs => COALESCE(CAST(:created_minutes AS float8), 0) * 60))
                RETURNING id
                """
            ),
            {
                "user_id": str(user_id),
                "job_type": job_type,
                "status": status,
                "input_data": json.dumps(input_data or {}),
                "should_watermark": should_watermark,
                "is_public": is_public,
                "workflow_execution_id": None
                if workflow_execution_id is None
                else str(workflow_execution_id),
                "node_id": node_id,
                "provider_kind": provider_kind,
                "provider_task_id": provider_task_id,
                "minutes": started_minutes_ago,
                "reconcile_attempts": reconcile_attempts,
                "created_minutes": created_minutes_ago,
            },
        ).one()
        return uuid.UUID(str(row.id))

    return _run(bind, insert)


def reserve(
    bind: Bind,
    job_id: uuid.UUID,
    user_id: uuid.UUID,
    amount: float | Decimal,
    from_sub: float | Decimal | None = None,
    from_topup: float | Decimal | None = None,
) -> uuid.UUID:
    """Reserve ``amount`` credits for a job; returns the ``usage_logs`` id.

    Without a split this is the app's own reservation (``reserve_credits_for_job``: subscription
    pool first). With ``from_sub``/``from_topup`` the given split is taken from the pools as is, for
    tests that need a particular split.
    """
    if from_sub is None and from_topup is None:
        return _run(bind, lambda conn: reserve_credits_for_job(conn, job_id, user_id, amount))
    sub = Decimal(str(from_sub or 0))
    topup = Decimal(str(from_topup or 0))
    total = Decimal(str(amount))
    if sub + topup != total:
        raise ValueError(f"from_sub {sub} + from_topup {topup} != amount {total}")

    return _run(bind, lambda conn: record_reservation(conn, job_id, user_id, total, sub, topup))


def make_workflow(
    bind: Bind,
    user_id: uuid.UUID,
    *,
    status: str = "failed",
    failed_nodes: list[str] | None = None,
    mcp_client: str | None = None,
) -> uuid.UUID:
    """A ``workflow_executions`` row of ``user_id`` (``failed_nodes`` empty unless given)."""
    return _run(
        bind,
        lambda conn: conn.execute(
            sa.text(
                "INSERT INTO workflow_executions (user_id, status, failed_nodes, mcp_client) "
                "VALUES (:u, :s, CAST(:f AS jsonb), :m) RETURNING id"
            ),
            {"u": str(user_id), "s": status, "f": json.dumps(failed_nodes or []), "m": mcp_client},
        ).scalar_one(),
    )


def sql(bind: Bind, statement: str, **params: Any) -> None:
    """Put a row in a state the code under test cannot reach by itself (an expired lease, a value
    Python cannot load); uuid parameters are passed as text."""
    _run(
        bind,
        lambda conn: conn.execute(
            sa.text(statement), {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in params.items()}
        ),
    )


def job_state(bind: Bind, job_id: uuid.UUID) -> dict[str, Any]:
    """A job's status, attempts and last error (``job_row``'s ``SELECT *`` would fail to load a row
    holding a timestamp Python cannot represent)."""
    return _run(
        bind,
        lambda conn: dict(
            conn.execute(
                sa.text("SELECT status, reconcile_attempts, reconcile_last_error FROM jobs WHERE id = :j"),
                {"j": str(job_id)},
            )
            .mappings()
            .one()
        ),
    )


def nan_reservation(bind: sa.Engine, job_id: uuid.UUID, user_id: uuid.UUID) -> None:
    """A reservation of NaN credits in the app's ledger (which may hold one: no CHECK of ours
    refuses it); a NOT VALID CHECK an older schema has is dropped for the insert and put back."""
    with bind.begin() as conn:
        had = conn.execute(
            sa.text("SELECT count(*) FROM pg_constraint WHERE conname = 'usage_logs_amount_not_nan'")
        ).scalar_one()
        conn.exec_driver_sql("ALTER TABLE usage_logs DROP CONSTRAINT IF EXISTS usage_logs_amount_not_nan")
        conn.execute(
            sa.text(
                "INSERT INTO usage_logs (job_id, user_id, status, amount, metadata) "
                'VALUES (:j, :u, \'reserved\', \'NaN\', \'{"from_sub": "NaN", "from_topup": "0"}\')'
            ),
            {"j": str(job_id), "u": str(user_id)},
        )
        if had:
            conn.exec_driver_sql(
                "ALTER TABLE usage_logs ADD CONSTRAINT usage_logs_amount_not_nan "
                "CHECK (amount <> 'NaN'::numeric) NOT VALID"
            )


def balances(bind: Bind, user_id: uuid.UUID) -> tuple[Decimal, Decimal]:
    """``(subscription_credits, topup_credits)`` of a user."""
    row = _run(
        bind,
        lambda conn: conn.execute(
            sa.text("SELECT subscription_credits, topup_credits FROM user_credits WHERE user_id = :u"),
            {"u": str(user_id)},
        ).one(),
    )
    return Decimal(row.subscription_credits), Decimal(row.topup_credits)


def job_row(bind: Bind, job_id: uuid.UUID) -> dict[str, Any]:
    """Every column of a jobs row, as a dict."""
    return _run(
        bind,
        lambda conn: dict(
            conn.execute(sa.text("SELECT * FROM jobs WHERE id = :id"), {"id": str(job_id)}).mappings().one()
        ),
    )


def bulk_jobs(bind: Bind, count: int, *, inflight_fraction: float = 0.01, legacy_inflight: int = 0) -> None:
    """Insert ``count`` jobs (plus ``legacy_inflight``) in bulk, shaped like a production table.

    About ``inflight_fraction`` of the ``count`` rows are pending/processing, of every kind in the
    registry, with provider calls started 0-3 hours ago; the rest finished over the last 30 days,
    one in 15 of them a legacy row written before the reconcile columns existed (no ``provider_kind``, no
    ``provider_call_started_at``). ``legacy_inflight`` adds that many in-flight legacy rows
    (stuck since before those columns, aged 0-3 hours by ``created_at``): a cohort that does not grow
    with the table. Pseudo-random but deterministic per row number.
    """
    from recon_dagster.core.kinds import KIND_NAMES

    inflight = (
        f"abs(hashtext(g::text || 'status')) % {max(1, round(1 / inflight_fraction))} = 0"
        if inflight_fraction > 0
        else "false"
    )
    kinds = "(ARRAY[" + ", ".join(f"'{k}'" for k in KIND_NAMES) + "]::text[])"
    pick_kind = f"{kinds}[1 + abs(hashtext(g::text || 'kind')) % {len(KIND_NAMES)}]"
    age = "make_interval(secs => abs(hashtext(g::text || 'age')) % {span})"
    user_id = str(uuid.uuid4())
    rows = f"""
    INSERT INTO jobs (user_id, job_type, status, provider_kind, provider_task_id,
                      provider_call_started_at, created_at, completed_at)
    SELECT CAST(:user_id AS uuid), 'image', status, kind,
           CASE WHEN kind IS NOT NULL THEN 'task-' || g END,
           CASE WHEN kind IS NOT NULL THEN started END,
           started - interval '5 seconds',
           CASE WHEN status IN ('pending', 'processing') THEN NULL ELSE started + interval '2 minutes' END
    FROM (
      SELECT g, status,
             CASE WHEN status IN ('pending', 'processing') OR abs(hashtext(g::text || 'legacy')) % 15 <> 0
                  THEN {pick_kind} END AS kind,
             now() - CASE WHEN status IN ('pending', 'processing') THEN {age.format(span=180 * 60)}
                          ELSE {age.format(span=30 * 86400)} END AS started
      FROM (
        SELECT g, CASE WHEN {inflight}
                       THEN (ARRAY['pending', 'processing', 'processing'])[1 + g % 3]
                       ELSE (ARRAY['completed', 'completed', 'completed', 'failed', 'cancelled'])[1 + g % 5]
                  END AS status
        FROM generate_series(1, :count) AS g
      ) numbered
    ) shaped
    """
    legacy = f"""
    INSERT INTO jobs (user_id, job_type, status, created_at)
    SELECT CAST(:user_id AS uuid), 'image', (ARRAY['pending', 'processing'])[1 + g % 2],
           now() - {age.format(span=180 * 60)}
    FROM generate_series(1, :count) AS g
    """

    def insert(conn: sa.Connection) -> None:
        conn.execute(sa.text(rows), {"user_id": user_id, "count": count})
        if legacy_inflight:
            conn.execute(sa.text(legacy), {"user_id": user_id, "count": legacy_inflight})

    _run(bind, insert)


def job_row_value(
    *, kind: str | None, task: str | None, job_type: str = "image", attempts: int = 0, **fields: Any
) -> JobRow:
    """An in-flight ``JobRow`` in memory (for the pure functions: decide, plan, batches)."""
    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "status": "processing",
        "user_id": uuid.uuid4(),
        "job_type": job_type,
        "provider_kind": kind,
        "provider_task_id": task,
        "provider_call_started_at": now,
        "reconcile_attempts": attempts,
        "reconcile_last_error": None,
        "reconcile_lease_owner": None,
        "reconcile_lease_expires_at": None,
        "should_watermark": False,
        "is_public": None,
        "workflow_execution_id": None,
        "node_id": None,
        "progress": 0,
        "created_at": now,
        "started_at": None,
    }
    return JobRow(**{**values, **fields})


def unsaved_job_row(provider_kind: str | None, provider_task_id: str | None) -> JobRow:
    """A ``JobRow`` as a scan would load it (in flight, called just now), never written anywhere."""
    return JobRow(
        id=uuid.uuid4(),
        status="processing",
        user_id=uuid.uuid4(),
        job_type="image",
        provider_kind=provider_kind,
        provider_task_id=provider_task_id,
        provider_call_started_at=datetime.now(UTC),
        reconcile_attempts=0,
        reconcile_last_error=None,
        reconcile_lease_owner=None,
        reconcile_lease_expires_at=None,
        should_watermark=False,
        is_public=None,
        workflow_execution_id=None,
        node_id=None,
        progress=0,
        created_at=datetime.now(UTC),
        started_at=None,
    )
