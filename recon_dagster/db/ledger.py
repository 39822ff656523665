"""The create ledger (``upstream_creates``, migration 148): every create sent, every task id it returned.

The rules of the writes a worker makes are the contract functions of migration 160
(``recon.create_intent``, ``create_task``, ``create_lost``; ``db/contract.py``): these are their
Python callers. The worker library writes a create's intent before the request leaves (``record_intent``), its task
id the moment the provider answers (``record_task``, its own transaction, before the job's row is
touched), or that the answer was lost (``record_outcome``: ambiguous) or that nothing was created
(refused). The orphan sweep reads it to tell our tasks at the provider from anyone else's, and
writes what became of each task (``set_fate``).

Identity is deterministic: a create is the job's n-th (``seq``), its id ``uuid5("<job>/<seq>")``
and its marker ``"<job>.<seq>"``; every write is a guarded statement that a retry repeats
harmlessly. Functions take a ``Connection``: the caller owns the transaction.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from recon_dagster.core.redaction import redact_secrets
from recon_dagster.db import contract
from recon_dagster.db.sqltext import sql

TABLE = "upstream_creates"
# The namespace of create ids: uuid5(LEDGER_NAMESPACE, "<job_id>/<seq>").
LEDGER_NAMESPACE = uuid.UUID("6c2b7f64-53d5-5a0e-9a55-7265636f6e39")
_MARKER_RE = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.([0-9]{1,9})")
# Where a create carries its marker: never part of what it asked for.
CALLBACK_KEYS = frozenset({"webhook", "webhook_events_filter", "callBackUrl", "name"})
# Keys never fingerprinted: credentials a payload may carry.
SECRET_KEYS = frozenset({"api_key", "apikey", "token", "authorization", "password", "secret", "key"})


class CreateState(StrEnum):
    SENDING = "sending"  # recorded, not yet answered (or the worker died before it knew)
    CREATED = "created"  # a task id came back
    AMBIGUOUS = "ambiguous"  # the answer was lost after the request may have arrived
    REFUSED = "refused"  # certainly no task: an error answer, or never sent
    UNRECORDED = "unrecorded"  # a task id reported with no intent recorded before it


class Fate(StrEnum):
    """What became of a create's task."""

    ATTACHED = "attached"  # the job's row names it: the reconciler owns it
    ADOPTED = "adopted"  # attached by the orphan sweep to a job in flight without a task
    CANCELLED = "cancelled"  # running after its job stopped owning it: the provider accepted a cancel
    ORPHAN_BILLED = "orphan_billed"  # succeeded after its job ended: billed, reported
    ENDED = "ended"  # failed, cancelled or expired upstream on its own: nothing bills
    NOT_FOUND = "not_found"  # the provider knows no such task (a cancel answered not found)
    # A cancel that did not stop it: the provider cannot cancel (KIE) ...
    CANCEL_REFUSED = "cancel_refused"
    # ... or answered that it had already ended (fal's ALREADY_COMPLETED): it may have succeeded.
    ALREADY_ENDED = "already_ended"
    # Its job was force-failed while the task may still run, and no cancel was made then (the
    # provider did not answer, or was not asked during an outage): the sweep cancels it
    # (``reconcile.stop_upstream``).
    HANDED_TO_SWEEP = "handed_to_sweep"


# Fates that are not an end: the sweep keeps following such a task (listed or polled) until it
# ends, then judges that end like any orphan's (``orphan_billed`` or ``ended``).
FOLLOWED = frozenset({Fate.CANCEL_REFUSED, Fate.ALREADY_ENDED, Fate.HANDED_TO_SWEEP})


@dataclass(frozen=True)
class Create:
    id: uuid.UUID
    job_id: uuid.UUID
    seq: int
    provider: str
    provider_kind: str
    marker: str
    marker_sent: bool
    fingerprint: str
    intent_at: datetime
    state: str
    state_at: datetime
    task_id: str | None
    task_recorded_at: datetime | None
    fate: str | None
    fate_at: datetime | None
    fate_detail: dict[str, Any] = field(default_factory=dict)
    looked_at: datetime | None = None
    detail: str = ""


_COLUMNS = ", ".join(Create.__dataclass_fields__)


def _create(m: sa.RowMapping | Mapping[str, Any]) -> Create:
    values = {k: m[k] for k in Create.__dataclass_fields__}
    values["id"], values["job_id"] = uuid.UUID(str(m["id"])), uuid.UUID(str(m["job_id"]))
    values["fate_detail"] = dict(m["fate_detail"] or {})
    return Create(**values)


# --- identity ---------------------------------------------------------------------------------------


def create_id(job_id: uuid.UUID | str, seq: int) -> uuid.UUID:
    return uuid.uuid5(LEDGER_NAMESPACE, f"{uuid.UUID(str(job_id))}/{seq}")


def marker_for(job_id: uuid.UUID | str, seq: int) -> str:
    return f"{uuid.UUID(str(job_id))}.{seq}"


def parse_marker(text: str | None) -> tuple[uuid.UUID, int] | None:
    """(job id, seq) of the first marker in ``text`` (a URL, a name), or None."""
    match = _MARKER_RE.search(text or "")
    return None if match is None else (uuid.UUID(match.group(1)), int(match.group(2)))


def _scrub(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _scrub(v) for k, v in value.items() if str(k).lower() not in SECRET_KEYS}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def fingerprint(payload: Mapping[str, Any]) -> str:
    """sha256 of what a create asked for in canonical JSON: its ``input`` when it has one (what a
    provider's list of tasks shows back), else the whole request without its callback URLs;
    credentials left out and registered secrets masked, so it never holds a key."""
    asked = payload["input"] if isinstance(payload, Mapping) and "input" in payload else payload
    if isinstance(asked, Mapping):
        asked = {k: v for k, v in asked.items() if k not in CALLBACK_KEYS}
    text = json.dumps(_scrub(asked), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(redact_secrets(text).encode()).hexdigest()


# --- writes -----------------------------------------------------------------------------------------


def _from_answer(answer: Mapping[str, Any]) -> Create:
    """The ledger row a contract function answered (``create``, as jsonb: timestamps in ISO text)."""
    row = dict(answer["create"])
    for k in ("intent_at", "state_at", "task_recorded_at", "fate_at", "looked_at"):
        if row.get(k) is not None:
            row[k] = datetime.fromisoformat(row[k])
    return _create(row)


def record_intent(
    conn: sa.Connection,
    job_id: uuid.UUID | str,
    *,
    provider: str,
    kind: str,
    fingerprint: str,
    marker_sent: bool,
) -> Create:
    """The job's next create, recorded before it is sent; returns it (with its seq and marker).
    The rule is ``recon.create_intent`` (migration 160)."""
    answer = contract.call(
        conn, "create_intent", job=str(uuid.UUID(str(job_id))), provider=provider, kind=kind,
        fingerprint=fingerprint, marker_sent=marker_sent,
    )  # fmt: skip
    contract.fix_call(answer)
    return _from_answer(answer)


def record_task(
    conn: sa.Connection,
    job_id: uuid.UUID | str,
    *,
    provider: str,
    kind: str,
    task_id: str,
    create: uuid.UUID | None = None,
) -> Create:
    """Record the task id a create returned. With ``create`` (its intent), that row gets it;
    without, a row in state ``unrecorded`` is added (a create sent outside the worker library's
    ``run``). Idempotent: the same task id again returns the row already holding it.
    The rule is ``recon.create_task`` (migration 160)."""
    if not isinstance(task_id, str) or not task_id.strip():
        raise ValueError(f"provider task id must be a non-empty string, got {task_id!r}")
    answer = contract.call(
        conn, "create_task", job=str(uuid.UUID(str(job_id))), provider=provider, kind=kind, task_id=task_id,
        create=None if create is None else str(create),
    )  # fmt: skip
    contract.fix_call(answer)
    return _from_answer(answer)


def record_outcome(conn: sa.Connection, create: uuid.UUID, state: CreateState, detail: str = "") -> bool:
    """An unanswered create's end without a task id: ambiguous or refused. Only from ``sending``
    (a task id recorded first wins); True if written. The rule is ``recon.create_lost``."""
    if state not in (CreateState.AMBIGUOUS, CreateState.REFUSED):
        raise ValueError(f"record_outcome takes ambiguous or refused, not {state}")
    answer = contract.call(
        conn, "create_lost", create=str(create), state=state.value, detail=redact_secrets(detail)
    )
    contract.fix_call(answer)
    return bool(answer["written"])


def set_fate(
    conn: sa.Connection,
    create: uuid.UUID,
    fate: Fate,
    detail: Mapping[str, Any] | None = None,
    *,
    replaces: Collection[Fate] = (),
) -> bool:
    """Record what became of a create's task: only over no fate yet, or one of ``replaces``
    (a guarded compare-and-set); True if written."""
    r = conn.execute(
        sql(
            f"""
            UPDATE {TABLE} SET fate = :f, fate_at = now(), fate_detail = CAST(:d AS jsonb)
            WHERE id = :id AND (fate IS NULL OR fate = ANY(:from)) RETURNING id
            """
        ).bindparams(sa.bindparam("from", type_=pg.ARRAY(sa.Text))),
        {
            "id": str(create), "f": fate.value, "from": [f.value for f in replaces],
            "d": json.dumps(dict(detail or {}), default=str),
        },
    ).first()  # fmt: skip
    return r is not None


def set_fates(conn: sa.Connection, creates: Collection[uuid.UUID], fate: Fate) -> int:
    """``set_fate`` for many creates at once, each only over no fate yet; how many were written."""
    if not creates:
        return 0
    r = conn.execute(
        sql(
            f"UPDATE {TABLE} SET fate = :f, fate_at = now() WHERE id = ANY(:ids) AND fate IS NULL"
        ).bindparams(sa.bindparam("ids", type_=pg.ARRAY(pg.UUID))),
        {"ids": [str(c) for c in creates], "f": fate.value},
    )
    return int(r.rowcount or 0)


def look_began(conn: sa.Connection) -> datetime:
    """The database's clock now (the clock ``state_at`` is written by): when a list walk begins.
    A create that ends after this instant may be missing from every page the walk reads."""
    return conn.execute(sql("SELECT clock_timestamp()")).scalar_one()  # type: ignore[no-any-return]


def mark_looked(conn: sa.Connection, creates: Iterable[uuid.UUID], began: datetime) -> int:
    """The sweep listed the provider over these creates' time windows in a walk that began at
    ``began`` (``look_began``): the newest instant every page could show. Never moves a stamp back."""
    ids = [str(c) for c in creates]
    if not ids:
        return 0
    r = conn.execute(
        sql(
            f"""
            UPDATE {TABLE} SET looked_at = GREATEST(COALESCE(looked_at, :at), :at)
            WHERE id = ANY(:ids)
            """
        ).bindparams(sa.bindparam("ids", type_=pg.ARRAY(pg.UUID))),
        {"ids": ids, "at": began},
    )
    return int(r.rowcount or 0)


# --- reads ------------------------------------------------------------------------------------------


def creates_of_job(conn: sa.Connection, job_id: uuid.UUID | str) -> list[Create]:
    """Every create of one job, in order (``explain``)."""
    rows = conn.execute(
        sql(f"SELECT {_COLUMNS} FROM {TABLE} WHERE job_id = :j ORDER BY seq"), {"j": str(job_id)}
    ).mappings()
    return [_create(r) for r in rows]


def by_task_ids(conn: sa.Connection, provider: str, task_ids: Collection[str]) -> dict[str, Create]:
    """The creates holding any of ``task_ids`` at ``provider``, by task id."""
    if not task_ids:
        return {}
    rows = conn.execute(
        sql(f"SELECT {_COLUMNS} FROM {TABLE} WHERE provider = :p AND task_id = ANY(:t)").bindparams(
            sa.bindparam("t", type_=pg.ARRAY(sa.Text))
        ),
        {"p": provider, "t": list(task_ids)},
    ).mappings()
    return {str(r["task_id"]): _create(r) for r in rows}


def by_ids(conn: sa.Connection, ids: Collection[uuid.UUID]) -> dict[uuid.UUID, Create]:
    if not ids:
        return {}
    rows = conn.execute(
        sql(f"SELECT {_COLUMNS} FROM {TABLE} WHERE id = ANY(:ids)").bindparams(
            sa.bindparam("ids", type_=pg.ARRAY(pg.UUID))
        ),
        {"ids": [str(i) for i in ids]},
    ).mappings()
    return {c.id: c for c in map(_create, rows)}


def unanswered(conn: sa.Connection, provider: str, since: datetime) -> list[Create]:
    """``provider``'s creates since ``since`` still without a task id and not refused: sending
    (maybe a worker died before the answer) or ambiguous. The sweep looks for their tasks."""
    rows = conn.execute(
        sql(
            f"""
            SELECT {_COLUMNS} FROM {TABLE}
            WHERE provider = :p AND intent_at >= :since AND task_id IS NULL
              AND state IN ('sending', 'ambiguous') AND fate IS NULL
            ORDER BY intent_at
            """
        ),
        {"p": provider, "since": since},
    ).mappings()
    return [_create(r) for r in rows]


def unjudged_tasks(conn: sa.Connection, provider: str, since: datetime) -> list[Create]:
    """``provider``'s creates since ``since`` with a task id and no fate yet, or a fate still
    followed (a cancel that did not stop it) whatever its age (KIE's whole record: it has no list
    endpoint)."""
    rows = conn.execute(
        sql(
            f"""
            SELECT {_COLUMNS} FROM {TABLE}
            WHERE provider = :p AND task_id IS NOT NULL
              AND ((intent_at >= :since AND fate IS NULL) OR fate = ANY(:followed))
            ORDER BY intent_at
            """
        ).bindparams(sa.bindparam("followed", type_=pg.ARRAY(sa.Text))),
        {"p": provider, "since": since, "followed": [f.value for f in FOLLOWED]},
    ).mappings()
    return [_create(r) for r in rows]


def followed(conn: sa.Connection, provider: str) -> list[Create]:
    """``provider``'s tasks whose cancel did not stop them (a ``FOLLOWED`` fate), whatever their
    age: the sweep follows each until it ends."""
    rows = conn.execute(
        sql(
            f"""
            SELECT {_COLUMNS} FROM {TABLE}
            WHERE provider = :p AND task_id IS NOT NULL AND fate = ANY(:followed)
            ORDER BY intent_at
            """
        ).bindparams(sa.bindparam("followed", type_=pg.ARRAY(sa.Text))),
        {"p": provider, "followed": [f.value for f in FOLLOWED]},
    ).mappings()
    return [_create(r) for r in rows]


def awaiting_look(
    conn: sa.Connection, job_ids: Collection[uuid.UUID], providers: Collection[str], wait: timedelta
) -> set[uuid.UUID]:
    """Jobs among ``job_ids`` with any create (not only the latest: a refused retry must not
    unmask an earlier lost one) at one of ``providers`` (those that can be listed) still
    unanswered and not yet looked for by a list walk that began after it ended so: the sweep must
    look for its task before such a job is failed and refunded. ``wait`` after its intent a
    create no longer holds its job (the look is overdue: the job is swept as before)."""
    if not job_ids or not providers:
        return set()
    rows = conn.execute(
        sql(
            f"""
            SELECT DISTINCT c.job_id FROM {TABLE} c
            WHERE c.job_id = ANY(:ids) AND c.provider = ANY(:p) AND c.task_id IS NULL AND c.fate IS NULL
              AND c.state IN ('sending', 'ambiguous')
              AND (c.looked_at IS NULL OR c.looked_at < c.state_at)
              AND c.intent_at > now() - make_interval(secs => :wait)
            """
        ).bindparams(
            sa.bindparam("ids", type_=pg.ARRAY(pg.UUID)), sa.bindparam("p", type_=pg.ARRAY(sa.Text))
        ),
        {"ids": [str(j) for j in job_ids], "p": list(providers), "wait": wait.total_seconds()},
    ).scalars()
    return {uuid.UUID(str(j)) for j in rows}


__all__ = [
    "LEDGER_NAMESPACE",
    "TABLE",
    "FOLLOWED",
    "Create",
    "CreateState",
    "Fate",
    "awaiting_look",
    "by_ids",
    "by_task_ids",
    "create_id",
    "creates_of_job",
    "fingerprint",
    "followed",
    "look_began",
    "mark_looked",
    "marker_for",
    "parse_marker",
    "record_intent",
    "record_outcome",
    "record_task",
    "set_fate",
    "set_fates",
    "unanswered",
    "unjudged_tasks",
]
