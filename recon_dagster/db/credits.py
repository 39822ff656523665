"""Credits: reservation, commit and refund against ``usage_logs`` (spec D7, 5.4, 5.6).

A job's credits are reserved when the app accepts it: the amount leaves the user's pools
(subscription first, then top-up) and a ``usage_logs`` row records the split in
``metadata.from_sub`` / ``metadata.from_topup``. Settling that row is a compare-and-set on
``status = 'reserved'``: the first commit or refund wins, every later one is a no-op, so balances
move exactly once however many writers race.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import sqlalchemy as sa

from recon_dagster.db import contract
from recon_dagster.db.sqltext import sql


class InsufficientCredits(Exception):
    pass


@dataclass(frozen=True)
class UsageLog:
    id: uuid.UUID
    job_id: uuid.UUID
    user_id: uuid.UUID
    status: str
    amount: Decimal
    metadata: dict[str, Any]


@dataclass(frozen=True)
class Refund:
    usage_log_id: uuid.UUID
    user_id: uuid.UUID
    amount: Decimal
    to_subscription: Decimal
    to_topup: Decimal
    # Further usage logs of the same job refunded with it (an app that reserved twice).
    extra: tuple[uuid.UUID, ...] = ()


_LEDGER_QUANTUM = Decimal("0.0001")  # numeric(14, 4) in usage_logs and user_credits


def ledger_amount(value: Decimal | float | int | str) -> Decimal:
    """A credit amount as the ledger stores it (4 decimals); ValueError for NaN, infinite, negative."""
    try:
        amount = Decimal(str(value))
    except ArithmeticError:
        raise ValueError(f"credit amount {value!r} is not a number") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"credit amount must be a finite non-negative number, got {value!r}")
    return amount.quantize(_LEDGER_QUANTUM, rounding=ROUND_HALF_UP)


def reserve_credits_for_job(
    conn: sa.Connection, job_id: uuid.UUID, user_id: uuid.UUID, amount: Decimal | float | int
) -> uuid.UUID:
    """What the app does when it accepts a job: take credits, subscription pool first.

    The amount is rounded to the ledger's 4 decimals first, so the recorded split always adds up
    to the stored amount (and a refund can put it back exactly).
    """
    amount = ledger_amount(amount)
    bal = conn.execute(
        sql("SELECT subscription_credits, topup_credits FROM user_credits WHERE user_id = :u FOR UPDATE"),
        {"u": str(user_id)},
    ).first()
    if bal is None or bal.subscription_credits + bal.topup_credits < amount:
        raise InsufficientCredits(f"user {user_id} cannot cover {amount} credits")
    from_sub = min(bal.subscription_credits, amount)
    return record_reservation(conn, job_id, user_id, amount, from_sub, amount - from_sub)


def record_reservation(
    conn: sa.Connection,
    job_id: uuid.UUID,
    user_id: uuid.UUID,
    amount: Decimal,
    from_sub: Decimal,
    from_topup: Decimal,
) -> uuid.UUID:
    """Take a decided split from the pools and write the ``reserved`` usage log that records it.

    Every value must be a finite non-negative number and the parts must add up to the amount;
    otherwise ValueError, before any balance moves.
    """
    amount, from_sub, from_topup = (ledger_amount(v) for v in (amount, from_sub, from_topup))
    if from_sub + from_topup != amount:
        raise ValueError(f"split {from_sub} + {from_topup} does not add up to {amount}")
    conn.execute(
        sql(
            """
            UPDATE user_credits SET subscription_credits = subscription_credits - :s,
              topup_credits = topup_credits - :t, updated_at = now()
            WHERE user_id = :u
            """
        ),
        {"u": str(user_id), "s": from_sub, "t": from_topup},
    )
    row = conn.execute(
        sql(
            """
            INSERT INTO usage_logs (job_id, user_id, status, amount, metadata)
            VALUES (:j, :u, 'reserved', :a, CAST(:m AS jsonb)) RETURNING id
            """
        ),
        {
            "j": str(job_id),
            "u": str(user_id),
            "a": amount,
            "m": json.dumps({"from_sub": str(from_sub), "from_topup": str(from_topup)}),
        },
    ).first()
    assert row is not None
    return uuid.UUID(str(row.id))


def find_reserved_usage_log(conn: sa.Connection, job_id: uuid.UUID) -> UsageLog | None:
    """D7: the reservation is found by job id, never through a column on jobs."""
    r = conn.execute(
        sql(
            """
            SELECT id, job_id, user_id, status, amount, metadata FROM usage_logs
            WHERE job_id = :j AND status = 'reserved' ORDER BY created_at LIMIT 1
            """
        ),
        {"j": str(job_id)},
    ).first()
    if r is None:
        return None
    return UsageLog(r.id, r.job_id, r.user_id, r.status, r.amount, r.metadata or {})


# Half the ledger's last digit: two split values that differ by less than this round to the same
# stored amount. The app is JavaScript: 0.3 reserved as 0.1 + 0.2 is written as
# {"from_sub": 0.1, "from_topup": 0.19999999999999998}, which is the same split.
SPLIT_TOLERANCE = _LEDGER_QUANTUM / 2


def valid_amount(value: object) -> Decimal | None:
    """A stored money value as a Decimal, or None when it is not finite and non-negative (NaN)."""
    try:
        amount = value if isinstance(value, Decimal) else Decimal(str(value))
    except ArithmeticError:
        return None
    return amount if amount.is_finite() and amount >= 0 else None


def _reserved_logs(conn: sa.Connection, job_id: uuid.UUID) -> list[sa.Row[Any]]:
    """Every ``reserved`` usage log of a job, oldest first, locked (a concurrent settler waits,
    then sees them settled and skips them)."""
    return list(
        conn.execute(
            sql(
                """
                SELECT id, user_id, amount, metadata FROM usage_logs
                WHERE job_id = :j AND status = 'reserved'
                ORDER BY created_at, id FOR UPDATE
                """
            ),
            {"j": str(job_id)},
        ).all()
    )


def _settle(conn: sa.Connection, usage_log_id: uuid.UUID, status: str, cost: Decimal | None = None) -> bool:
    """Compare-and-set one usage log from ``reserved`` to ``status``."""
    r = conn.execute(
        sql(
            """
            UPDATE usage_logs SET status = :s, settled_at = now(),
              provider_cost_usd = COALESCE(CAST(:cost AS numeric), provider_cost_usd)
            WHERE id = :id AND status = 'reserved' RETURNING id
            """
        ),
        {"id": str(usage_log_id), "s": status, "cost": cost},
    ).first()
    return r is not None


def _usable(conn: sa.Connection, job_id: uuid.UUID, logs: list[sa.Row[Any]]) -> list[sa.Row[Any]]:
    """The logs whose amount is a real money value; each other one becomes a credit anomaly and
    stays ``reserved``, its balances untouched, for a person to resolve."""
    out = []
    for r in logs:
        if valid_amount(r.amount) is not None:
            out.append(r)
            continue
        log_credit_anomaly(
            conn,
            job_id=job_id,
            user_id=r.user_id,
            reason="invalid_credit_amount",
            details={"usage_log_id": str(r.id), "amount": str(r.amount), "left": "reserved"},
        )
    return out


def _flag_extra_reservations(
    conn: sa.Connection, job_id: uuid.UUID, logs: list[sa.Row[Any]], settled_as: str
) -> None:
    if len(logs) < 2:
        return
    log_credit_anomaly(
        conn,
        job_id=job_id,
        user_id=logs[0].user_id,
        reason="extra_reservation",
        amount=sum((r.amount for r in logs[1:]), Decimal(0)),
        details={
            "usage_logs": [{"id": str(r.id), "amount": str(r.amount)} for r in logs],
            "first": settled_as,
            "extra": "refunded",
        },
    )


# valid_amount's test in SQL: numeric holds NaN, which PostgreSQL orders above every number, and
# (unconstrained, as a host app's column may be) +Infinity, which is >= 0 but not money.
def sole_commit_ctes(gate: str = "") -> str:
    """The common case of a commit as three ``WITH`` entries (``logs``, ``sole``, ``settled``):
    the job's (``:j``) reserved logs locked oldest first, as ``_reserved_logs`` does, and, when
    there is exactly one and its amount is a real money value, that one committed at ``:cost``.

    ``gate``: a further condition on ``logs`` (``AND ...``), for a statement that commits only
    when its own earlier part won (see ``reconcile.completion.settle_completion``)."""
    return f"""
    logs AS (
      SELECT id, user_id, amount, metadata, created_at FROM usage_logs
      WHERE job_id = :j AND status = 'reserved'{gate}
      ORDER BY created_at, id FOR UPDATE
    ), sole AS (
      SELECT id FROM logs
      WHERE (SELECT count(*) FROM logs) = 1
        AND amount <> 'NaN'::numeric AND amount >= 0 AND amount < 'Infinity'::numeric
    ), settled AS (
      UPDATE usage_logs u SET status = 'committed', settled_at = now(),
        provider_cost_usd = COALESCE(CAST(:cost AS numeric), provider_cost_usd)
      FROM sole WHERE u.id = sole.id AND u.status = 'reserved'
      RETURNING u.id
    )"""


# The locked logs as commit_locked takes them: oldest first, each with whether it was committed.
LOCKED_LOGS = """
    SELECT logs.id, logs.user_id, logs.amount, logs.metadata, logs.created_at,
           EXISTS (SELECT 1 FROM settled WHERE settled.id = logs.id) AS committed
    FROM logs"""

_COMMIT_SOLE = sql(f"WITH {sole_commit_ctes()} {LOCKED_LOGS} ORDER BY logs.created_at, logs.id")


def commit_cost(provider_cost_usd: float | Decimal | None) -> Decimal | None:
    """The provider's cost as the commit records it (``:cost``); None for none or an unusable
    figure (not worth refusing the commit over)."""
    cost = None if provider_cost_usd is None else Decimal(str(provider_cost_usd))
    return cost if cost is None or cost.is_finite() else None


def commit_job_credits(
    conn: sa.Connection, job_id: uuid.UUID, provider_cost_usd: float | Decimal | None
) -> uuid.UUID | None:
    """Settle the reservation as spent, recording the provider's actual cost.

    A job is charged once: with more than one ``reserved`` log, the oldest is committed and every
    other one is refunded to its pools, with an ``extra_reservation`` anomaly. A log whose amount
    is not a finite non-negative number is never settled (``invalid_credit_amount`` anomaly).
    Returns the committed usage log id, or None when nothing was reserved any more.
    """
    cost = commit_cost(provider_cost_usd)
    locked = list(conn.execute(_COMMIT_SOLE, {"j": str(job_id), "cost": cost}).all())
    return commit_locked(conn, job_id, cost, locked)


def commit_locked(
    conn: sa.Connection, job_id: uuid.UUID, cost: Decimal | None, locked: list[sa.Row[Any]]
) -> uuid.UUID | None:
    """The rest of a commit once ``sole_commit_ctes`` ran: ``locked`` are its ``LOCKED_LOGS``.
    One log committed there is the common case; anything else (several logs, a bad amount) goes
    the general way here, on the rows the statement locked."""
    if len(locked) == 1 and locked[0].committed:
        return uuid.UUID(str(locked[0].id))
    logs = _usable(conn, job_id, locked)
    if not logs:
        return None
    first, extra = logs[0], logs[1:]
    committed = _settle(conn, first.id, "committed", cost)
    for r in extra:
        _refund_log(conn, job_id, r)
    _flag_extra_reservations(conn, job_id, logs, "committed")
    return uuid.UUID(str(first.id)) if committed else None


def refund_reserved_credits_for_job(conn: sa.Connection, job_id: uuid.UUID) -> Refund | None:
    """Give a job's reserved credits back to the pools they came from.

    Every ``reserved`` log of the job is refunded (a failed job keeps none of its reservations);
    more than one is an ``extra_reservation`` anomaly. The returned ``Refund`` carries the oldest
    log's id and the totals. None when nothing was reserved (already committed or refunded): no
    double refund. A reservation without a usable pool split is refunded to the top-up pool
    (top-up credits do not expire, so the user cannot lose them) and logged as a credit anomaly.
    A log whose amount is not a finite non-negative number moves no balance (see commit).
    """
    logs = _usable(conn, job_id, _reserved_logs(conn, job_id))
    refunds = [rf for r in logs if (rf := _refund_log(conn, job_id, r)) is not None]
    if not refunds:
        return None
    _flag_extra_reservations(conn, job_id, logs, "refunded")
    first = refunds[0]
    return Refund(
        first.usage_log_id,
        first.user_id,
        sum((rf.amount for rf in refunds), Decimal(0)),
        sum((rf.to_subscription for rf in refunds), Decimal(0)),
        sum((rf.to_topup for rf in refunds), Decimal(0)),
        extra=tuple(rf.usage_log_id for rf in refunds[1:]),
    )


def _refund_log(conn: sa.Connection, job_id: uuid.UUID, r: sa.Row[Any]) -> Refund | None:
    """Refund one reserved usage log to its pools (CAS on ``reserved``)."""
    amount = valid_amount(r.amount)
    if amount is None or not _balances_usable(conn, job_id, r.user_id):
        return None
    if not _settle(conn, r.id, "refunded"):
        return None
    to_sub, to_topup, ok = split_refund(amount, r.metadata or {})
    if not ok:
        log_credit_anomaly(
            conn,
            job_id=job_id,
            user_id=r.user_id,
            reason="refund_split_missing",
            amount=amount,
            details={"metadata": r.metadata, "refunded_to": "topup"},
        )
    conn.execute(
        sql(
            """
            INSERT INTO user_credits (user_id, subscription_credits, topup_credits)
            VALUES (:u, :s, :t)
            ON CONFLICT (user_id) DO UPDATE SET
              subscription_credits = user_credits.subscription_credits + EXCLUDED.subscription_credits,
              topup_credits = user_credits.topup_credits + EXCLUDED.topup_credits,
              updated_at = now()
            """
        ),
        {"u": str(r.user_id), "s": to_sub, "t": to_topup},
    )
    return Refund(uuid.UUID(str(r.id)), uuid.UUID(str(r.user_id)), amount, to_sub, to_topup)


def _balances_usable(conn: sa.Connection, job_id: uuid.UUID, user_id: uuid.UUID) -> bool:
    """False (and a credit anomaly) when the user's balance already holds a NaN: adding to it
    would keep it NaN, and the ledger's NaN guard refuses that write, so nothing moves."""
    bal = conn.execute(
        sql("SELECT subscription_credits, topup_credits FROM user_credits WHERE user_id = :u FOR UPDATE"),
        {"u": str(user_id)},
    ).first()
    if bal is None or all(valid_amount(v) is not None for v in bal):
        return True
    log_credit_anomaly(
        conn,
        job_id=job_id,
        user_id=user_id,
        reason="invalid_user_balance",
        details={
            "subscription_credits": str(bal.subscription_credits),
            "topup_credits": str(bal.topup_credits),
        },
    )
    return False


def _metadata_number(value: object) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise TypeError(f"not a number: {value!r}")
    # str() of a float is its shortest round-trip form: 0.19999999999999998 stays that, exactly.
    return Decimal(str(value).strip())


def split_refund(amount: Decimal, metadata: object) -> tuple[Decimal, Decimal, bool]:
    """(to subscription, to top-up, usable) for refunding ``amount`` per the recorded split.

    The split is usable when both parts are finite, not below zero and add up to ``amount``
    within half the ledger's last digit. The subscription part is then rounded to the ledger's
    4 decimals and the top-up pool gets the rest, so the pools get back exactly ``amount``.
    Otherwise everything goes to the top-up pool and ``usable`` is False.
    """
    try:
        if not isinstance(metadata, dict):
            raise TypeError("metadata is not an object")
        from_sub = _metadata_number(metadata["from_sub"])
        from_topup = _metadata_number(metadata["from_topup"])
        usable = (
            from_sub.is_finite()
            and from_topup.is_finite()
            and from_sub >= -SPLIT_TOLERANCE
            and from_topup >= -SPLIT_TOLERANCE
            and abs(from_sub + from_topup - amount) <= SPLIT_TOLERANCE
        )
    except (KeyError, ArithmeticError, ValueError, TypeError):
        usable = False
    if not usable:
        return Decimal(0), amount, False
    to_sub = min(max(from_sub.quantize(_LEDGER_QUANTUM, rounding=ROUND_HALF_UP), Decimal(0)), amount)
    return to_sub, amount - to_sub, True


def log_credit_anomaly(
    conn: sa.Connection,
    *,
    job_id: uuid.UUID | None,
    user_id: uuid.UUID | None,
    reason: str,
    amount: Decimal | float | None = None,
    details: dict[str, Any] | None = None,
) -> bool:
    """One anomaly per (job, reason): a repeated report is a no-op. True if newly logged.

    credit_anomalies is the app's table and need not have a unique index on (job_id, reason). So
    the writer first takes the (job, reason)'s row in recon_dagster's own
    ``recon_credit_anomaly_keys`` (migration 145), whose primary key makes a concurrent writer of
    the same pair wait for this transaction; then, as a separate statement (a fresh snapshot that
    sees what such a writer committed), it inserts only if no such anomaly exists. A row deleted by
    an operator is logged again if the problem recurs, as before. An anomaly without a job is
    always logged."""
    # The rule is recon.credit_anomaly (migration 160), the same the app workers' functions use.
    return bool(
        contract.value(
            conn,
            "credit_anomaly",
            job=None if job_id is None else str(job_id),
            user=None if user_id is None else str(user_id),
            reason=reason,
            details=json.dumps(details or {}, default=str),
            amount=amount,
        )  # fmt: skip
    )
