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
        sa.text("SELECT subscription_credits, topup_credits FROM user_credits WHERE user_id = :u FOR UPDATE"),
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
    """Take a decided split from the pools and write the ``reserved`` usage log that records it."""
    conn.execute(
        sa.text(
            """
            UPDATE user_credits SET subscription_credits = subscription_credits - :s,
              topup_credits = topup_credits - :t, updated_at = now()
            WHERE user_id = :u
            """
        ),
        {"u": str(user_id), "s": from_sub, "t": from_topup},
    )
    row = conn.execute(
        sa.text(
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
        sa.text(
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


def commit_job_credits(
    conn: sa.Connection, job_id: uuid.UUID, provider_cost_usd: float | Decimal | None
) -> uuid.UUID | None:
    """Settle the reservation as spent, recording the provider's actual cost.

    Returns the usage log id, or None when nothing was reserved any more (already settled).
    """
    r = conn.execute(
        sa.text(
            """
            UPDATE usage_logs SET status = 'committed', provider_cost_usd = :cost, settled_at = now()
            WHERE id = (SELECT id FROM usage_logs WHERE job_id = :j AND status = 'reserved'
                        ORDER BY created_at LIMIT 1)
              AND status = 'reserved'
            RETURNING id
            """
        ),
        {"j": str(job_id), "cost": None if provider_cost_usd is None else Decimal(str(provider_cost_usd))},
    ).first()
    return None if r is None else uuid.UUID(str(r.id))


def refund_reserved_credits_for_job(conn: sa.Connection, job_id: uuid.UUID) -> Refund | None:
    """Give a job's reserved credits back to the pools they came from.

    None when nothing was reserved (already committed or refunded): no double refund. A
    reservation without a usable pool split is refunded to the top-up pool (top-up credits do not
    expire, so the user cannot lose them) and logged as a credit anomaly for review.
    """
    r = conn.execute(
        sa.text(
            """
            UPDATE usage_logs SET status = 'refunded', settled_at = now()
            WHERE id = (SELECT id FROM usage_logs WHERE job_id = :j AND status = 'reserved'
                        ORDER BY created_at LIMIT 1)
              AND status = 'reserved'
            RETURNING id, user_id, amount, metadata
            """
        ),
        {"j": str(job_id)},
    ).first()
    if r is None:
        return None
    to_sub, to_topup, ok = _split(r.amount, r.metadata or {})
    if not ok:
        log_credit_anomaly(
            conn,
            job_id=job_id,
            user_id=r.user_id,
            reason="refund_split_missing",
            amount=r.amount,
            details={"metadata": r.metadata, "refunded_to": "topup"},
        )
    conn.execute(
        sa.text(
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
    return Refund(uuid.UUID(str(r.id)), uuid.UUID(str(r.user_id)), r.amount, to_sub, to_topup)


def _split(amount: Decimal, metadata: dict[str, Any]) -> tuple[Decimal, Decimal, bool]:
    try:
        from_sub = Decimal(str(metadata["from_sub"]))
        from_topup = Decimal(str(metadata["from_topup"]))
        usable = (
            from_sub.is_finite()
            and from_topup.is_finite()
            and from_sub >= 0
            and from_topup >= 0
            and from_sub + from_topup == amount
        )
    except (KeyError, ArithmeticError, ValueError, TypeError):
        usable = False
    if not usable:
        return Decimal(0), amount, False
    return from_sub, from_topup, True


def log_credit_anomaly(
    conn: sa.Connection,
    *,
    job_id: uuid.UUID | None,
    user_id: uuid.UUID | None,
    reason: str,
    amount: Decimal | float | None = None,
    details: dict[str, Any] | None = None,
) -> bool:
    """One anomaly per (job, reason): a repeated report is a no-op. True if newly logged."""
    r = conn.execute(
        sa.text(
            """
            INSERT INTO credit_anomalies (job_id, user_id, reason, amount, details)
            VALUES (:j, :u, :r, :a, CAST(:d AS jsonb))
            ON CONFLICT (job_id, reason) DO NOTHING RETURNING id
            """
        ),
        {
            "j": None if job_id is None else str(job_id),
            "u": None if user_id is None else str(user_id),
            "r": reason,
            "a": amount,
            "d": json.dumps(details or {}, default=str),
        },
    ).first()
    return r is not None
