"""The money paths against a real PostgreSQL: what a fail, a force-fail, a sweep and a finalize
do to credits, events, characters and the job row, and what a late one must NOT do.

Each test pins one rule whose breakage would move money or state the wrong way; the mutation run
(benchmarks/mutation.py) is what found them unpinned.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from recon_dagster.db import credits
from recon_dagster.db.engine import libpq_url
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.reconcile.finalize import (
    ProviderResult,
    fail_and_refund,
    finalize_job_with_media,
    force_fail_and_refund,
    sweep_no_recovery,
)
from recon_dagster.sandbox import SandboxServer
from recon_dagster_tests.support.factories import balances, job_row, make_job, make_user, reserve
from recon_dagster_tests.support.ledger import anomalies, usage_logs
from recon_dagster_tests.support.reconcile import finished_training

D = Decimal


# --- helpers -----------------------------------------------------------------------------------


def one(bind: sa.Engine, statement: str, **params: Any) -> Any:
    with bind.begin() as conn:
        return conn.execute(
            sa.text(statement), {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in params.items()}
        ).scalar()


def execute(bind: sa.Engine, statement: str, **params: Any) -> None:
    with bind.begin() as conn:
        conn.execute(
            sa.text(statement), {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in params.items()}
        )


def make_character(bind: sa.Engine, user: uuid.UUID, job: uuid.UUID, training_status: str) -> uuid.UUID:
    return one(
        bind,
        "INSERT INTO characters (user_id, name, training_status, training_job_id, error_message, "
        "lora_weights_url) VALUES (:u, 'c', :s, :j, 'earlier note', 'https://old/weights.tar') RETURNING id",
        u=user,
        s=training_status,
        j=job,
    )


def character(bind: sa.Engine, char_id: uuid.UUID) -> dict[str, Any]:
    with bind.begin() as conn:
        return dict(
            conn.execute(
                sa.text(
                    "SELECT training_status, error_message, lora_weights_url FROM characters WHERE id = :c"
                ),
                {"c": str(char_id)},
            )
            .mappings()
            .one()
        )


class Listener:
    """A real LISTEN job_events session on its own connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def events(self, timeout: float = 3.0) -> list[dict[str, Any]]:
        got = [json.loads(n.payload) for n in self.conn.notifies(timeout=timeout, stop_after=1)]
        # Drain anything else already delivered.
        got += [json.loads(n.payload) for n in self.conn.notifies(timeout=0.2)]
        return got

    def events_for(self, job_id: uuid.UUID, timeout: float = 3.0) -> list[dict[str, Any]]:
        return [e for e in self.events(timeout) if e.get("job_id") == str(job_id)]


@pytest.fixture
def listener(database_url: str, db: sa.Engine) -> Iterator[Listener]:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute("LISTEN job_events")
        yield Listener(conn)


@pytest.fixture
def store(media_dir: str) -> LocalMediaStore:
    return LocalMediaStore(base_dir=media_dir)


def finalize(db: sa.Engine, store: LocalMediaStore, job: uuid.UUID, **result: Any) -> Any:
    """Finalize a text success (a kind and job type that promise no media): no HTTP involved."""
    result.setdefault("provider_kind", "kie-standard")
    result.setdefault("result", {"text": "done"})
    return finalize_job_with_media(db, store, job, ProviderResult(**result), source="test")


def text_job(db: sa.Engine, user: uuid.UUID) -> uuid.UUID:
    return make_job(db, user, job_type="text", provider_kind="kie-standard", provider_task_id="t")


def finalize_training(db: sa.Engine, store: LocalMediaStore, sandbox: SandboxServer, job: uuid.UUID) -> Any:
    """Finalize a LoRA training the sandbox finished (its weights fetched over loopback HTTP); the
    row carries that training's id, as the worker persisted it."""
    task, result, policy = finished_training(sandbox)
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET provider_task_id = :t WHERE id = :j"), {"t": task, "j": str(job)}
        )
    return finalize_job_with_media(db, store, job, result, source="test", policy=policy)


def training_job(db: sa.Engine, user: uuid.UUID) -> uuid.UUID:
    return make_job(
        db, user, job_type="lora-training", provider_kind="replicate-training", provider_task_id="t-1"
    )


# --- a late fail does nothing at all ------------------------------------------------------------

LATE_FAILS = {
    "fail_and_refund": lambda db, job: fail_and_refund(db, job, "reconcile: upstream failed"),
    "force_fail_and_refund": lambda db, job: force_fail_and_refund(db, job, attempts=18, last_error="x"),
    "sweep_no_recovery": lambda db, job: sweep_no_recovery(db, job),
}


@pytest.mark.parametrize("path", sorted(LATE_FAILS))
@pytest.mark.parametrize("terminal", ["completed", "cancelled", "failed"])
@pytest.mark.slow
def test_a_late_fail_on_a_terminal_row_changes_nothing(
    db: sa.Engine, listener: Listener, path: str, terminal: str
) -> None:
    # The row is settled by someone else, but (a bug elsewhere, or a reservation made after it
    # settled) a reserved usage log still exists: a fail that lost its guarded write must not
    # refund it, announce anything, or touch the character.
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user, provider_kind="replicate-training", provider_task_id="t-1")
    reserve(db, job, user, 30)
    char = make_character(db, user, job, "training")
    execute(db, "UPDATE jobs SET status = :s, error_message = 'theirs' WHERE id = :id", s=terminal, id=job)
    before = (balances(db, user), usage_logs(db, job), character(db, char), job_row(db, job))

    assert LATE_FAILS[path](db, job) is False

    assert (balances(db, user), usage_logs(db, job), character(db, char), job_row(db, job)) == before
    assert listener.events_for(job, timeout=1.0) == []
    assert anomalies(db) == []


def test_a_fail_of_a_missing_row_is_false(db: sa.Engine) -> None:
    assert fail_and_refund(db, uuid.uuid4(), "x") is False
    assert force_fail_and_refund(db, uuid.uuid4(), attempts=3, last_error=None) is False
    assert anomalies(db) == []


# --- the fail paths: refund, event, message, character ----------------------------------------


@pytest.mark.parametrize("path", sorted(LATE_FAILS))
def test_every_fail_path_refunds_sends_one_failed_event_and_fails_the_character(
    db: sa.Engine, listener: Listener, path: str
) -> None:
    user = make_user(db, sub=20, topup=50)
    job = make_job(db, user, provider_kind="replicate-training", provider_task_id="t-1")
    reserve(db, job, user, 30)  # 20 from the subscription, 10 from top-up
    char = make_character(db, user, job, "training")

    assert LATE_FAILS[path](db, job) is True

    assert balances(db, user) == (D(20), D(50))
    assert [u["status"] for u in usage_logs(db, job)] == ["refunded"]
    assert listener.events_for(job) == [{"job_id": str(job), "status": "failed", "source": "reconcile"}]
    row = job_row(db, job)
    assert row["status"] == "failed"
    c = character(db, char)
    assert c["training_status"] == "failed"
    assert c["error_message"] == row["error_message"]


def test_fail_and_refund_writes_the_given_message(db: sa.Engine) -> None:
    user = make_user(db)
    job = make_job(db, user)
    assert fail_and_refund(db, job, "reconcile: upstream task not found")
    assert job_row(db, job)["error_message"] == "reconcile: upstream task not found"


def test_a_sweep_says_the_row_could_not_be_recovered(db: sa.Engine) -> None:
    user = make_user(db)
    job = make_job(db, user, provider_kind="anthropic-sync")
    assert sweep_no_recovery(db, job)
    assert job_row(db, job)["error_message"] == "reconcile_no_recovery"


@pytest.mark.parametrize("status", ["ready", "failed"])
def test_a_fail_never_flips_a_settled_character(db: sa.Engine, status: str) -> None:
    user = make_user(db)
    job = make_job(db, user, provider_kind="replicate-training", provider_task_id="t-1")
    char = make_character(db, user, job, status)
    before = character(db, char)

    assert fail_and_refund(db, job, "reconcile: upstream failed")

    assert character(db, char) == before


def test_a_fail_without_a_reservation_still_fails_and_announces(db: sa.Engine, listener: Listener) -> None:
    user = make_user(db, sub=5, topup=5)
    job = make_job(db, user)
    assert fail_and_refund(db, job, "reconcile: x")
    assert balances(db, user) == (D(5), D(5))
    assert [e["status"] for e in listener.events_for(job)] == ["failed"]


# --- force-fail: the reconcile_exhausted anomaly ---------------------------------------------------


def test_force_fail_logs_the_exhausted_anomaly_with_the_refunded_amount(db: sa.Engine) -> None:
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="task-9")
    reserve(db, job, user, D("12.5"))

    assert force_fail_and_refund(db, job, attempts=18, last_error="upstream still running")

    assert job_row(db, job)["error_message"] == (
        "reconcile_exhausted: 18 attempts; last error: upstream still running"
    )
    (a,) = anomalies(db)
    assert (a["job_id"], a["user_id"], a["reason"], a["amount"]) == (
        job,
        user,
        "reconcile_exhausted",
        D("12.5"),
    )
    assert a["details"] == {
        "attempts": 18,
        "last_error": "upstream still running",
        "provider_kind": "kie-standard",
        "provider_task_id": "task-9",
        "refunded": True,
    }
    assert balances(db, user) == (D(100), D(50))


def test_force_fail_without_a_reservation_logs_no_amount(db: sa.Engine) -> None:
    user = make_user(db)
    job = make_job(db, user, provider_kind="kie-veo", provider_task_id="v-1")

    assert force_fail_and_refund(db, job, attempts=3, last_error=None)

    assert job_row(db, job)["error_message"] == "reconcile_exhausted: 3 attempts; last error: -"
    (a,) = anomalies(db)
    assert (a["user_id"], a["amount"], a["details"]["refunded"], a["details"]["last_error"]) == (
        user,
        None,
        False,
        None,
    )


# --- finalize: cost, display cost, event, character ------------------------------------------------


def test_finalize_commits_with_the_provider_cost_and_writes_it_on_the_job(
    db: sa.Engine, store: LocalMediaStore, listener: Listener
) -> None:
    user = make_user(db, sub=100, topup=0)
    job = text_job(db, user)
    reserve(db, job, user, D("7.5"))

    out = finalize(db, store, job, cost_usd=0.125)

    assert out.ok and out.credits_committed
    (log,) = usage_logs(db, job)
    assert (log["status"], log["provider_cost_usd"]) == ("committed", D("0.125"))
    row = job_row(db, job)
    assert (row["status"], row["provider"], row["provider_cost"]) == ("completed", "kie", D("0.125"))
    assert listener.events_for(job) == [{"job_id": str(job), "status": "completed", "source": "test"}]
    assert balances(db, user) == (D("92.5"), D(0))


def test_finalize_display_cost_falls_back_to_the_reserved_amount(
    db: sa.Engine, store: LocalMediaStore
) -> None:
    user = make_user(db)
    job = text_job(db, user)
    reserve(db, job, user, D("7.5"))
    assert finalize(db, store, job).ok
    assert job_row(db, job)["display_cost"] == D("7.5")


def test_finalize_display_cost_given_by_the_caller_wins(db: sa.Engine, store: LocalMediaStore) -> None:
    user = make_user(db)
    job = text_job(db, user)
    reserve(db, job, user, D("7.5"))
    assert finalize(db, store, job, display_cost=3.0).ok
    assert job_row(db, job)["display_cost"] == D(3)


def test_finalize_without_a_reservation_has_no_display_cost(db: sa.Engine, store: LocalMediaStore) -> None:
    user = make_user(db)
    job = text_job(db, user)
    out = finalize(db, store, job, cost_usd=None)
    assert out.ok and not out.credits_committed
    row = job_row(db, job)
    assert (row["display_cost"], row["provider_cost"]) == (None, None)


def test_finalize_clears_an_old_error_message_and_the_lease(db: sa.Engine, store: LocalMediaStore) -> None:
    user = make_user(db)
    job = text_job(db, user)
    execute(
        db,
        "UPDATE jobs SET error_message = 'worker timed out', reconcile_lease_owner = 'run-1', "
        "reconcile_lease_expires_at = now() + interval '5 minutes' WHERE id = :id",
        id=job,
    )
    assert finalize(db, store, job).ok
    row = job_row(db, job)
    assert (row["error_message"], row["reconcile_lease_owner"], row["reconcile_lease_expires_at"]) == (
        None,
        None,
        None,
    )
    assert row["progress"] == 100 and row["completed_at"] is not None


@pytest.mark.parametrize("status", ["ready", "failed"])
def test_finalize_never_flips_a_settled_character(
    db: sa.Engine, store: LocalMediaStore, sandbox: SandboxServer, status: str
) -> None:
    user = make_user(db)
    job = training_job(db, user)
    char = make_character(db, user, job, status)
    before = character(db, char)

    out = finalize_training(db, store, sandbox, job)

    assert out.ok and not out.character_updated
    assert character(db, char) == before


@pytest.mark.parametrize("status", ["pending", "training"])
def test_finalize_makes_a_training_character_ready(
    db: sa.Engine, store: LocalMediaStore, sandbox: SandboxServer, status: str
) -> None:
    user = make_user(db)
    job = training_job(db, user)
    char = make_character(db, user, job, status)

    out = finalize_training(db, store, sandbox, job)

    assert out.ok and out.character_updated
    c = character(db, char)
    assert (c["training_status"], c["error_message"]) == ("ready", None)
    assert c["lora_weights_url"] == out.stored[0].url


def test_finalize_of_another_kind_leaves_a_character_alone(db: sa.Engine, store: LocalMediaStore) -> None:
    user = make_user(db)
    job = text_job(db, user)
    char = make_character(db, user, job, "training")
    out = finalize(db, store, job)
    assert out.ok and not out.character_updated
    assert character(db, char)["training_status"] == "training"


@pytest.mark.parametrize("terminal", ["completed", "cancelled", "failed"])
@pytest.mark.slow
def test_a_late_finalize_changes_nothing(
    db: sa.Engine, store: LocalMediaStore, listener: Listener, terminal: str
) -> None:
    user = make_user(db)
    job = text_job(db, user)
    reserve(db, job, user, 10)
    execute(db, "UPDATE jobs SET status = :s WHERE id = :id", s=terminal, id=job)
    before = (balances(db, user), usage_logs(db, job), job_row(db, job))

    out = finalize(db, store, job, cost_usd=1.0)

    assert not out.ok and out.reason == f"already {terminal}"
    assert (balances(db, user), usage_logs(db, job), job_row(db, job)) == before
    assert listener.events_for(job, timeout=1.0) == []


# --- a second reservation after the first settled ---------------------------------------------------


def second_reservation(
    db: sa.Engine, first_settled_as: str
) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID, uuid.UUID]:
    """A job whose first reservation (10) is settled and a second one (20) open: user, job, first, second."""
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user)
    first = reserve(db, job, user, 10)
    execute(
        db,
        "UPDATE usage_logs SET status = :s, settled_at = now() WHERE id = :id",
        s=first_settled_as,
        id=first,
    )
    return user, job, first, reserve(db, job, user, 20)


@pytest.mark.parametrize("first_settled_as", ["committed", "refunded"])
def test_commit_settles_the_open_reservation_not_the_settled_one(
    db: sa.Engine, first_settled_as: str
) -> None:
    _, job, first, second = second_reservation(db, first_settled_as)

    with db.begin() as conn:
        assert credits.commit_job_credits(conn, job, D("0.5")) == second

    status = {u["id"]: (u["status"], u["provider_cost_usd"]) for u in usage_logs(db, job)}
    assert status == {first: (first_settled_as, None), second: ("committed", D("0.5"))}


@pytest.mark.parametrize("first_settled_as", ["committed", "refunded"])
def test_refund_settles_the_open_reservation_not_the_settled_one(
    db: sa.Engine, first_settled_as: str
) -> None:
    user, job, first, second = second_reservation(db, first_settled_as)
    after_reserving = balances(db, user)

    with db.begin() as conn:
        got = credits.refund_reserved_credits_for_job(conn, job)

    assert got is not None and got.usage_log_id == second and got.amount == D(20)
    assert balances(db, user) == (after_reserving[0] + 20, after_reserving[1])
    status = {u["id"]: u["status"] for u in usage_logs(db, job)}
    assert status == {first: first_settled_as, second: "refunded"}


def test_commit_and_refund_of_an_unrelated_job_touch_nothing(db: sa.Engine) -> None:
    user = make_user(db)
    job, other = make_job(db, user), make_job(db, user)
    log = reserve(db, job, user, 10)
    with db.begin() as conn:
        assert credits.commit_job_credits(conn, other, 1) is None
        assert credits.refund_reserved_credits_for_job(conn, other) is None
    assert [(u["id"], u["status"]) for u in usage_logs(db, job)] == [(log, "reserved")]


@pytest.mark.parametrize("settle", ["commit", "refund"])
def test_two_open_reservations_are_settled_once_and_flagged_with_what_a_person_needs(
    db: sa.Engine, settle: str
) -> None:
    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user)
    first = reserve(db, job, user, 30)
    second = reserve(db, job, user, D("12.5"))

    with db.begin() as conn:
        if settle == "commit":
            assert credits.commit_job_credits(conn, job, None) == first
        else:
            got = credits.refund_reserved_credits_for_job(conn, job)
            assert got is not None and (got.usage_log_id, got.extra, got.amount) == (
                first,
                (second,),
                D("42.5"),
            )

    (a,) = anomalies(db)
    assert (a["job_id"], a["user_id"], a["reason"], a["amount"]) == (
        job,
        user,
        "extra_reservation",
        D("12.5"),
    )
    assert a["details"] == {
        "usage_logs": [{"id": str(first), "amount": "30.0000"}, {"id": str(second), "amount": "12.5000"}],
        "first": "committed" if settle == "commit" else "refunded",
        "extra": "refunded",
    }
