"""The app workers' contract, as the Python library calls it: the functions of migrations 160, 161, 170.

Every rule a worker keeps (the create ledger, the guarded task-id write, a sync call's start, what
to resume, the account's tokens, slots and Retry-After) lives once, in SQL functions of the
``recon`` schema of the app's database, so a worker in any language keeps the same contract
(``docs/app-contract.md``). This module is how the Python side calls them: ``call`` runs one
function in the caller's transaction and returns its answer (a dict whose ``next`` says what to do),
and ``require`` checks, once per engine, that the database has the contract this library was
built for, else fails with one line naming the fix.
"""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa

from recon_dagster.db.sqltext import sql

# The contract this library was built for; the database answers its own (recon.contract_version()).
CONTRACT_VERSION = 3  # 2: migration 161 (recon.open_create); 3: 170 (open_create: a task not on the row)
SCHEMA = "recon"
MIGRATE_HINT = "run `recon-dagster migrate`"

# Each function's parameters in order, with their SQL types (the call names them, so a later
# version may add parameters with defaults without moving these).
FUNCTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "mark_call_start": (("job", "uuid"), ("kind", "text")),
    "resume_point": (("job", "uuid"),),
    # 161/170: asked before any create: whether an earlier create may have made a task the row
    # does not name (a worker killed between the send and the answer, or between the ledger's
    # task id and the row's); then no create is sent.
    "open_create": (("job", "uuid"),),
    "create_intent": (
        ("job", "uuid"),
        ("provider", "text"),
        ("kind", "text"),
        ("fingerprint", "text"),
        ("marker_sent", "boolean"),
    ),  # fmt: skip
    "create_task": (
        ("job", "uuid"),
        ("provider", "text"),
        ("kind", "text"),
        ("task_id", "text"),
        ("create", "uuid"),
    ),
    "attach_task": (("job", "uuid"), ("kind", "text"), ("task_id", "text")),
    "create_answered": (
        ("job", "uuid"),
        ("provider", "text"),
        ("kind", "text"),
        ("task_id", "text"),
        ("create", "uuid"),
    ),  # fmt: skip
    "create_lost": (("create", "uuid"), ("state", "text"), ("detail", "text")),
    "take_token": (
        ("account", "text"),
        ("bucket", "text"),
        ("max_wait_s", "double precision"),
        ("n", "integer"),
        ("refund", "integer"),
    ),  # fmt: skip
    "token_blocked": (("account", "text"), ("bucket", "text")),
    "take_slot": (
        ("account", "text"),
        ("kind", "text"),
        ("holder", "text"),
        ("ttl_s", "double precision"),
        ("n", "integer"),
        ("cap", "integer"),
        ("reserve", "integer"),
    ),  # fmt: skip
    "renew_slots": (("account", "text"), ("holders", "text[]"), ("ttl_s", "double precision")),
    "release_slot": (("account", "text"), ("slot", "integer"), ("holder", "text")),
    "record_retry_after": (("account", "text"), ("seconds", "double precision")),
    # Not a step of a worker's own: the one writer of a credit anomaly (attach_task's, and
    # db/credits.py's for the reconciler).
    "credit_anomaly": (
        ("job", "uuid"),
        ("user", "uuid"),
        ("reason", "text"),
        ("details", "jsonb"),
        ("amount", "numeric"),
    ),
}


class ContractUnavailable(RuntimeError):
    """The app's database lacks the contract functions, or has an older contract: one line."""


def call_sql(function: str, names: tuple[str, ...]) -> str:
    """``SELECT recon.<function>(p_a => CAST(:a AS t), ...)`` for the parameters given."""
    types = dict(FUNCTIONS[function])
    args = ", ".join(f"p_{n} => CAST(:{n} AS {types[n]})" for n in names)
    return f"SELECT {SCHEMA}.{function}({args})"


def call(conn: sa.Connection, function: str, **params: Any) -> dict[str, Any]:
    """Run ``recon.<function>`` with ``params`` (by name; left out: the function's default) in
    the caller's transaction; its answer."""
    return dict(value(conn, function, **params))


def value(conn: sa.Connection, function: str, **params: Any) -> Any:
    """What ``recon.<function>`` returns, as the driver reads it (``call``'s answers are jsonb)."""
    return conn.execute(sql(call_sql(function, tuple(params))), params).scalar_one()


def fix_call(answer: dict[str, Any]) -> None:
    """A ``fix_call`` answer is the caller's programming error: ``ValueError`` with its line."""
    if answer.get("next") == "fix_call":
        raise ValueError(str(answer.get("message") or answer.get("reason")))


def database_version(conn: sa.Connection) -> int | None:
    """The contract version the database answers; None when it has no contract functions."""
    exists = conn.execute(
        sql("SELECT to_regprocedure(:f) IS NOT NULL"), {"f": f"{SCHEMA}.contract_version()"}
    ).scalar_one()
    if not exists:
        return None
    return int(conn.execute(sql(f"SELECT {SCHEMA}.contract_version()")).scalar_one())


def check(version: int | None, wanted: int | None = None) -> str | None:
    """Why a worker built for contract ``wanted`` (default: this library's) cannot start on a
    database answering ``version``, in one line; None when it can."""
    wanted = CONTRACT_VERSION if wanted is None else wanted
    if version is None:
        return (
            f"the app's database has no recon_dagster contract functions ({SCHEMA}.contract_version() "
            f"is missing): {MIGRATE_HINT}"
        )
    if version < wanted:
        return (
            f"the app's database has contract version {version}, this worker needs {wanted}: {MIGRATE_HINT}"
        )
    return None


_CHECKED: set[tuple[str, int]] = set()
_CHECKED_LOCK = threading.Lock()


def require(engine: sa.Engine) -> None:
    """At a worker's start (and, cached, before its first contract call on ``engine``): the
    database has the contract this library was built for, else ``ContractUnavailable``."""
    key = (engine.url.render_as_string(hide_password=True), CONTRACT_VERSION)
    with _CHECKED_LOCK:
        if key in _CHECKED:
            return
    with engine.connect() as conn:
        problem = check(database_version(conn))
    if problem is not None:
        raise ContractUnavailable(problem)
    with _CHECKED_LOCK:
        _CHECKED.add(key)


__all__ = [
    "CONTRACT_VERSION",
    "FUNCTIONS",
    "SCHEMA",
    "ContractUnavailable",
    "call",
    "call_sql",
    "check",
    "database_version",
    "fix_call",
    "require",
    "value",
]
