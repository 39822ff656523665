"""Credits against a real PostgreSQL: reservation split, CAS commit and refund, credit anomalies."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recon_dagster.db import credits
from recon_dagster_tests.support.factories import balances, make_job, make_user, reserve
from recon_dagster_tests.support.ledger import anomalies, usage_logs

D = Decimal


def commit(bind: sa.Engine, job_id: uuid.UUID, cost: float | None = 0.25) -> uuid.UUID | None:
    with bind.begin() as conn:
        return credits.commit_job_credits(conn, job_id, cost)


def refund(bind: sa.Engine, job_id: uuid.UUID) -> credits.Refund | None:
    with bind.begin() as conn:
        return credits.refund_reserved_credits_for_job(conn, job_id)


def set_metadata(bind: sa.Engine, usage_log_id: uuid.UUID, metadata_json: str) -> None:
    with bind.begin() as conn:
        conn.execute(
            sa.text("UPDATE usage_logs SET metadata = CAST(:m AS jsonb) WHERE id = :id"),
            {"m": metadata_json, "id": str(usage_log_id)},
        )


# ---------------------------------------------------------------------------------------------
# Reservation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sub", "topup", "amount", "from_sub", "from_topup"),
    [
        (100, 50, 30, D(30), D(0)),  # the subscription pool covers it
        (20, 50, 30, D(20), D(10)),  # subscription first, the rest from top-up
        (0, 50, 30, D(0), D(30)),  # only top-up
        (20, 10, 30, D(20), D(10)),  # exactly everything the user has
        (10, 5, D("12.5"), D(10), D("2.5")),  # fractional credits
    ],
)
def test_reserve_takes_subscription_first_then_topup_and_records_the_split(
    db: sa.Engine, sub: int, topup: int, amount: Decimal | int, from_sub: Decimal, from_topup: Decimal
) -> None:
    user = make_user(db, sub=sub, topup=topup)
    job = make_job(db, user)

    log_id = reserve(db, job, user, amount)

    assert balances(db, user) == (D(sub) - from_sub, D(topup) - from_topup)
    (row,) = usage_logs(db, job)
    assert row["id"] == log_id
    assert (row["status"], row["amount"], row["user_id"]) == ("reserved", D(str(amount)), user)
    assert (D(row["metadata"]["from_sub"]), D(row["metadata"]["from_topup"])) == (from_sub, from_topup)
    with db.begin() as conn:
        found = credits.find_reserved_usage_log(conn, job)
    assert found is not None
    assert (found.id, found.job_id, found.amount) == (log_id, job, D(str(amount)))


def test_insufficient_credits_raises_and_changes_nothing(db: sa.Engine) -> None:
    user = make_user(db, sub=20, topup=9)
    job = make_job(db, user)

    with pytest.raises(credits.InsufficientCredits, match="30"):
        reserve(db, job, user, 30)

    assert balances(db, user) == (D(20), D(9))
    assert usage_logs(db, job) == []


def test_a_user_without_a_credits_row_cannot_reserve(db: sa.Engine) -> None:
    job = make_job(db, make_user(db))
    stranger = uuid.uuid4()

    with pytest.raises(credits.InsufficientCredits):
        reserve(db, job, stranger, 1)

    assert usage_logs(db, job) == []


def test_find_reserved_usage_log_is_none_once_settled(db: sa.Engine) -> None:
    user = make_user(db)
    job = make_job(db, user)
    reserve(db, job, user, 5)
    commit(db, job)

    with db.begin() as conn:
        assert credits.find_reserved_usage_log(conn, job) is None
        assert credits.find_reserved_usage_log(conn, uuid.uuid4()) is None


# ---------------------------------------------------------------------------------------------
# Commit
# ---------------------------------------------------------------------------------------------


def test_commit_is_a_cas_on_reserved(db: sa.Engine) -> None:
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user)
    log_id = reserve(db, job, user, 30)
    after_reserve = balances(db, user)

    assert commit(db, job, 0.125) == log_id
    assert commit(db, job, 9.0) is None

    (row,) = usage_logs(db, job)
    assert row["status"] == "committed"
    assert row["provider_cost_usd"] == D("0.125")
    assert row["settled_at"] is not None
    assert balances(db, user) == after_reserve  # spent: nothing comes back


def test_commit_with_unknown_cost_records_null(db: sa.Engine) -> None:
    user = make_user(db)
    job = make_job(db, user)
    reserve(db, job, user, 1)

    assert commit(db, job, None) is not None
    assert usage_logs(db, job)[0]["provider_cost_usd"] is None


def test_commit_without_a_reservation_is_none(db: sa.Engine) -> None:
    user = make_user(db)
    job = make_job(db, user)

    assert commit(db, job) is None
    assert balances(db, user) == (D(100), D(50))


# ---------------------------------------------------------------------------------------------
# Refund
# ---------------------------------------------------------------------------------------------


def test_refund_returns_each_pool_exactly_what_it_gave(db: sa.Engine) -> None:
    user = make_user(db, sub=20, topup=50)
    job = make_job(db, user)
    log_id = reserve(db, job, user, 30)
    assert balances(db, user) == (D(0), D(40))

    got = refund(db, job)

    assert got == credits.Refund(log_id, user, D(30), D(20), D(10))
    assert balances(db, user) == (D(20), D(50))
    (row,) = usage_logs(db, job)
    assert (row["status"], row["settled_at"] is not None) == ("refunded", True)
    assert anomalies(db) == []


def test_refund_of_an_explicit_split(db: sa.Engine) -> None:
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user)
    reserve(db, job, user, 30, from_sub=5, from_topup=25)
    assert balances(db, user) == (D(95), D(25))

    got = refund(db, job)

    assert got is not None
    assert (got.to_subscription, got.to_topup) == (D(5), D(25))
    assert balances(db, user) == (D(100), D(50))


def test_a_second_refund_is_a_no_op(db: sa.Engine) -> None:
    user = make_user(db, sub=20, topup=50)
    job = make_job(db, user)
    reserve(db, job, user, 30)
    assert refund(db, job) is not None
    restored = balances(db, user)

    assert refund(db, job) is None

    assert balances(db, user) == restored == (D(20), D(50))


def test_refund_after_commit_is_a_no_op(db: sa.Engine) -> None:
    user = make_user(db, sub=20, topup=50)
    job = make_job(db, user)
    reserve(db, job, user, 30)
    assert commit(db, job) is not None
    spent = balances(db, user)

    assert refund(db, job) is None

    assert balances(db, user) == spent == (D(0), D(40))
    assert usage_logs(db, job)[0]["status"] == "committed"


def test_commit_after_refund_is_a_no_op(db: sa.Engine) -> None:
    user = make_user(db, sub=20, topup=50)
    job = make_job(db, user)
    reserve(db, job, user, 30)
    assert refund(db, job) is not None

    assert commit(db, job) is None

    assert usage_logs(db, job)[0]["status"] == "refunded"
    assert balances(db, user) == (D(20), D(50))


def test_refund_without_a_reservation_is_none(db: sa.Engine) -> None:
    user = make_user(db)
    job = make_job(db, user)

    assert refund(db, job) is None
    assert balances(db, user) == (D(100), D(50))


@pytest.mark.parametrize(
    "metadata_json",
    [
        pytest.param("{}", id="missing"),
        pytest.param('{"from_sub": "20"}', id="half-missing"),
        pytest.param('{"from_sub": "abc", "from_topup": "10"}', id="not-a-number"),
        pytest.param('{"from_sub": null, "from_topup": null}', id="nulls"),
        pytest.param('{"from_sub": "25", "from_topup": "10"}', id="sum-too-big"),
        pytest.param('{"from_sub": "40", "from_topup": "-10"}', id="negative"),
        pytest.param('{"from_sub": {"x": 1}, "from_topup": [1]}', id="wrong-types"),
        pytest.param('["20", "10"]', id="array"),
        pytest.param('"20/10"', id="string"),
        pytest.param("null", id="json-null"),
        pytest.param('{"from_sub": "Infinity", "from_topup": "-Infinity"}', id="infinities"),
        pytest.param('{"from_sub": "NaN", "from_topup": "10"}', id="nan"),
    ],
)
def test_refund_with_a_garbled_split_goes_to_topup_and_logs_an_anomaly(
    db: sa.Engine, metadata_json: str
) -> None:
    user = make_user(db, sub=20, topup=50)
    job = make_job(db, user)
    log_id = reserve(db, job, user, 30)
    set_metadata(db, log_id, metadata_json)

    got = refund(db, job)

    assert got is not None
    assert (got.amount, got.to_subscription, got.to_topup) == (D(30), D(0), D(30))
    # Whole amount to top-up: the user can lose nothing (top-up credits do not expire).
    assert balances(db, user) == (D(0), D(70))
    (anomaly,) = anomalies(db)
    assert (anomaly["job_id"], anomaly["user_id"], anomaly["reason"]) == (job, user, "refund_split_missing")
    assert anomaly["amount"] == D(30)
    assert anomaly["details"]["refunded_to"] == "topup"
    assert refund(db, job) is None
    assert balances(db, user) == (D(0), D(70))
    assert len(anomalies(db)) == 1


def test_refund_to_a_user_whose_credits_row_vanished_recreates_it(db: sa.Engine) -> None:
    user = make_user(db, sub=20, topup=50)
    job = make_job(db, user)
    reserve(db, job, user, 30)
    with db.begin() as conn:
        conn.execute(sa.text("DELETE FROM user_credits WHERE user_id = :u"), {"u": str(user)})

    assert refund(db, job) is not None

    assert balances(db, user) == (D(20), D(10))


# ---------------------------------------------------------------------------------------------
# Credit anomalies
# ---------------------------------------------------------------------------------------------


def test_log_credit_anomaly_is_idempotent_per_job_and_reason(db: sa.Engine) -> None:
    user = make_user(db)
    job = make_job(db, user)
    other = make_job(db, user)

    with db.begin() as conn:
        first = credits.log_credit_anomaly(
            conn,
            job_id=job,
            user_id=user,
            reason="reconcile_exhausted",
            amount=D(3),
            details={"attempts": 18},
        )
        again = credits.log_credit_anomaly(
            conn,
            job_id=job,
            user_id=user,
            reason="reconcile_exhausted",
            amount=D(99),
            details={"attempts": 19},
        )
        other_reason = credits.log_credit_anomaly(
            conn, job_id=job, user_id=user, reason="duplicate_upstream_task"
        )
        other_job = credits.log_credit_anomaly(conn, job_id=other, user_id=user, reason="reconcile_exhausted")

    assert (first, again, other_reason, other_job) == (True, False, True, True)
    rows = anomalies(db)
    assert [(r["job_id"], r["reason"]) for r in rows] == [
        (job, "reconcile_exhausted"),
        (job, "duplicate_upstream_task"),
        (other, "reconcile_exhausted"),
    ]
    # The first report stands.
    assert (rows[0]["amount"], rows[0]["details"]) == (D(3), {"attempts": 18})
    assert rows[1]["details"] == {}


def test_log_credit_anomaly_details_survive_non_json_values(db: sa.Engine) -> None:
    job_id = uuid.uuid4()
    with db.begin() as conn:
        assert credits.log_credit_anomaly(
            conn, job_id=job_id, user_id=None, reason="r", details={"job": job_id, "amount": D("1.5")}
        )
    (row,) = anomalies(db)
    assert row["details"] == json.loads(json.dumps({"job": str(job_id), "amount": "1.5"}))


@pytest.mark.parametrize("amount", [-5, "NaN"])
def test_reserving_a_nonsense_amount_raises_and_changes_nothing(db: sa.Engine, amount: object) -> None:
    user = make_user(db, sub=20, topup=50)
    job = make_job(db, user)

    with pytest.raises(Exception):  # noqa: B017 -- what matters is that nothing moved
        reserve(db, job, user, D(str(amount)))

    assert balances(db, user) == (D(20), D(50))
    assert usage_logs(db, job) == []


def test_reserve_with_more_precision_than_the_ledger_refunds_to_the_same_pools(db: sa.Engine) -> None:
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user)
    reserve(db, job, user, D("1.23456"))

    got = refund(db, job)

    assert got is not None
    assert balances(db, user) == (D(100), D(50))
    assert anomalies(db) == []


# ---------------------------------------------------------------------------------------------
# Refund splits tolerate the app's floats
# ---------------------------------------------------------------------------------------------


def test_refund_splits_tolerate_the_apps_floats(db: sa.Engine) -> None:
    user = make_user(db, sub=10, topup=10)
    job = make_job(db, user)
    log_id = reserve(db, job, user, D("0.3"), from_sub=D("0.1"), from_topup=D("0.2"))
    # What JavaScript writes for 0.3 - 0.1.
    set_metadata(db, log_id, '{"from_sub": 0.1, "from_topup": 0.19999999999999998}')

    got = refund(db, job)

    assert got is not None
    assert (got.to_subscription, got.to_topup) == (D("0.1"), D("0.2"))
    assert balances(db, user) == (D(10), D(10))
    assert anomalies(db) == []


@pytest.mark.parametrize(
    ("metadata", "split", "usable"),
    [
        ({"from_sub": 0.1, "from_topup": 0.19999999999999998}, (D("0.1"), D("0.2")), True),
        ({"from_sub": 0.30000000000000004, "from_topup": 0}, (D("0.3"), D(0)), True),
        ({"from_sub": "0.10004", "from_topup": "0.2"}, (D("0.1"), D("0.2")), True),  # within half a digit
        ({"from_sub": "0.1001", "from_topup": "0.2"}, (D(0), D("0.3")), False),  # a whole digit off
        ({"from_sub": -0.00001, "from_topup": 0.30001}, (D(0), D("0.3")), True),
        ({"from_sub": True, "from_topup": 0}, (D(0), D("0.3")), False),
    ],
)
def test_split_refund_is_decimal_with_half_a_ledger_digit_of_tolerance(
    metadata: dict[str, Any], split: tuple[Decimal, Decimal], usable: bool
) -> None:
    assert credits.split_refund(D("0.3"), metadata) == (*split, usable)


_FOUR_DECIMALS = st.integers(min_value=0, max_value=10**10).map(lambda n: D(n).scaleb(-4))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sub=_FOUR_DECIMALS, topup=_FOUR_DECIMALS, js_subtracts=st.booleans())
@pytest.mark.slow
def test_refund_split_property_pools_get_back_exactly_the_reserved_amount(
    db: sa.Engine, sub: Decimal, topup: Decimal, js_subtracts: bool
) -> None:
    """Random pool splits written as JavaScript doubles, amounts with 4 decimals: the pools get
    back exactly the amount, split exactly as reserved, and no anomaly."""
    amount = sub + topup
    if amount == 0:
        return
    # The app writes numbers as doubles, and either records both parts or derives the top-up part.
    meta = {
        "from_sub": float(sub),
        "from_topup": float(amount) - float(sub) if js_subtracts else float(topup),
    }
    user = make_user(db, sub=sub, topup=topup)
    job = make_job(db, user)
    log_id = reserve(db, job, user, amount, from_sub=sub, from_topup=topup)
    set_metadata(db, log_id, json.dumps(meta))
    assert balances(db, user) == (0, 0)

    got = refund(db, job)

    assert got is not None
    assert (got.to_subscription, got.to_topup) == (sub, topup)
    assert balances(db, user) == (sub, topup)
    assert [a for a in anomalies(db) if a["job_id"] == job] == []


@settings(max_examples=300, deadline=None)
@given(
    sub=_FOUR_DECIMALS,
    topup=_FOUR_DECIMALS,
    digits_off=st.integers(min_value=-50, max_value=50),
    js_subtracts=st.booleans(),
)
def test_split_property_anomaly_only_when_the_metadata_really_disagrees(
    sub: Decimal, topup: Decimal, digits_off: int, js_subtracts: bool
) -> None:
    """A split whose parts add up to the amount give or take a JavaScript rounding is used as is; one
    off by a whole ledger digit or more is not (everything to top-up, and the caller logs it)."""
    amount = sub + topup
    recorded_topup = topup + D(digits_off).scaleb(-4)
    meta = {
        "from_sub": float(sub),
        "from_topup": float(amount + D(digits_off).scaleb(-4)) - float(sub)
        if js_subtracts
        else float(recorded_topup),
    }

    to_sub, to_topup, usable = credits.split_refund(amount, meta)

    assert to_sub + to_topup == amount
    if digits_off == 0:
        assert (to_sub, to_topup, usable) == (sub, topup, True)
    elif recorded_topup >= 0:
        assert (to_sub, to_topup, usable) == (D(0), amount, False)


@pytest.mark.parametrize("amount", ["NaN", "Infinity"])
def test_a_reservation_that_is_not_money_is_never_committed(db: sa.Engine, amount: str) -> None:
    """The one-statement commit of a sole reservation applies valid_amount's rule in SQL: a stored
    NaN (written before migration 138's guard), or +Infinity in a host app whose column is an
    unconstrained numeric, stays reserved with an anomaly; nothing is committed."""
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user)
    with db.connect() as conn:
        tx = conn.begin()
        try:  # the schema change and the row live in this transaction only, rolled back below
            conn.exec_driver_sql("ALTER TABLE usage_logs DROP CONSTRAINT IF EXISTS usage_logs_amount_not_nan")
            conn.exec_driver_sql("ALTER TABLE usage_logs ALTER COLUMN amount TYPE numeric")
            conn.execute(
                sa.text(
                    "INSERT INTO usage_logs (job_id, user_id, status, amount, metadata) "
                    'VALUES (:j, :u, \'reserved\', CAST(:a AS numeric), \'{"from_sub": "0", "from_topup": "0"}\')'
                ),
                {"j": str(job), "u": str(user), "a": amount},
            )

            assert credits.commit_job_credits(conn, job, 0.01) is None

            status = conn.execute(sa.text("SELECT status FROM usage_logs WHERE job_id = :j"), {"j": str(job)})
            assert status.scalar_one() == "reserved"
            reasons = (
                conn.execute(
                    sa.text("SELECT reason FROM credit_anomalies WHERE job_id = :j"), {"j": str(job)}
                )
                .scalars()
                .all()
            )
            assert reasons == ["invalid_credit_amount"]
        finally:
            tx.rollback()
    assert balances(db, user) == (D(100), D(50))
