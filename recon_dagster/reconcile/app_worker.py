"""What the app's workers call around a provider call (spec phases 1 and 4).

* ``make_on_task_created(job_id, kind)``: the callback a provider ``run`` fires once the upstream
  task exists, persisting ``provider_kind`` / ``provider_task_id`` / ``provider_call_started_at`` so
  a dead worker leaves something to recover from (5.2).
* ``mark_provider_call_start(job_id, kind)``: the sync-call equivalent, right before the call (5.8).
* ``run_or_resume(job_id, kind, create_and_run, providers=...)``: the stall-retry guard (5.3): when
  the row already carries a task id, resume that task instead of creating a second one; when an
  earlier create may have made a task the row does not name, create nothing (``CreateMayExist``).

Each step is a call of the contract's function in the app's database (migration 160,
``docs/app-contract.md``): the rules live there once, for a worker in any language; this module
turns their answers into the library's exceptions. The first call on an engine checks that the
database has the contract (``ContractUnavailable``: run migrate).

All three refuse a row that is no longer in flight (``JobNoLongerInFlight``): a job swept or
cancelled while it waited in the app's queue never gets upstream work started for it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

import sqlalchemy as sa

from recon_dagster.core.crashpoints import crash_point
from recon_dagster.core.kinds import get_kind
from recon_dagster.db import contract, ledger
from recon_dagster.db.engine import get_engine
from recon_dagster.providers.base import ProviderConfigError
from recon_dagster.providers.status import (
    AmbiguousCreateError,
    ProviderHTTPError,
    ProviderProtocolError,
    UpstreamStatus,
)

log = logging.getLogger("recon_dagster.reconcile.app_worker")

OnTaskCreated = Callable[[str], None]


class JobNotFound(LookupError):
    pass


class JobNoLongerInFlight(RuntimeError):
    """The job row is already completed, failed or cancelled: no upstream work may start for it.

    ``run_or_resume`` raises it before creating anything; the ``on_task_created`` callback raises
    it (after recording a credit anomaly) when the row ended while the create was in progress, so
    the provider's ``run`` stops instead of polling a task whose result would be refused.
    """

    def __init__(self, job_id: uuid.UUID, status: str) -> None:
        super().__init__(f"job {job_id} is {status}, no longer in flight: no upstream work started for it")
        self.job_id = job_id
        self.status = status


class TaskAlreadyPersisted(RuntimeError):
    """Another attempt persisted a different upstream task for this job first.

    Raised from the ``on_task_created`` callback so the provider's ``run`` stops before polling
    the duplicate; ``run_or_resume`` then resumes the persisted task instead.
    """

    def __init__(self, job_id: uuid.UUID, persisted: str, ours: str) -> None:
        super().__init__(f"job {job_id} already has upstream task {persisted}; not polling duplicate {ours}")
        self.job_id = job_id
        self.persisted = persisted
        self.ours = ours


class CreateMayExist(AmbiguousCreateError):
    """Not creating: an earlier create of this job may have made a task the row does not name.

    ``recon.open_create`` (migrations 161, 170) answered ``wait_for_sweep``: a create is in the
    ledger as ``sending`` (its worker died between the send and the answer) or ``ambiguous`` (its
    answer was lost), or with a task id the row does not name (``task_id``: its worker died
    between the two writes). Creating again could bill twice; the orphan sweep looks for that task
    first, then adopts it onto the row (a retry resumes it) or marks the create ``not_found`` (a
    retry creates). A retry later is safe; nothing was sent. ``create_id``: the ledger's create."""

    def __init__(self, job_id: uuid.UUID, create_id: str, message: str, task_id: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.create_id = create_id
        self.task_id = task_id


def open_create(job_id: uuid.UUID | str, *, engine: sa.Engine | None = None) -> None:
    """Before any create of ``job_id``: ``recon.open_create``; ``CreateMayExist`` unless no
    earlier create of the job may still have made a task (a retry after a crash looks first)."""
    job_uuid = uuid.UUID(str(job_id))
    eng = engine or get_engine()
    contract.require(eng)
    with eng.connect() as conn:
        answer = contract.call(conn, "open_create", job=str(job_uuid))
    contract.fix_call(answer)
    if answer["next"] != "create":
        log.warning("%s", answer.get("message"))
        raise CreateMayExist(
            job_uuid, str(answer.get("create_id")), str(answer.get("message")), answer.get("task_id")
        )


class Resumer(Protocol):
    def resume(self, kind: str, task_id: str) -> UpstreamStatus: ...


class TaskCreatedRecorder:
    """The ``on_task_created`` callback of one create: it keeps the create ledger too.

    Called by a provider's ``run`` with the task id the moment it exists: the id goes into the
    create ledger first, in its own transaction (so a worker killed before the row is updated
    still leaves it for the orphan sweep), then onto the job's row. Through the provider's ``run``
    it also records the create's intent before the request is sent, and a create that raised as
    ambiguous or refused. Called directly with a task id (a create sent outside ``run``), the id
    is recorded all the same."""

    def __init__(self, job_id: uuid.UUID, kind: str, engine: sa.Engine | None, opened: bool = False) -> None:
        self.job_id, self.kind, self._engine = job_id, kind, engine
        self.intent: ledger.Create | None = None
        # run_or_resume asked recon.open_create already; a recorder made on its own asks in
        # before_send (a create is never sent while an earlier one may have made a task).
        self._opened = opened

    @property
    def engine(self) -> sa.Engine:
        return self._engine or get_engine()

    def before_send(self, provider: str, kind: str, payload: dict[str, Any], marker_sent: bool) -> str:
        if self.intent is None:  # one intent per create, however often asked
            if not self._opened:
                open_create(self.job_id, engine=self.engine)
                self._opened = True
            contract.require(self.engine)
            with self.engine.begin() as conn:
                self.intent = ledger.record_intent(
                    conn, self.job_id, provider=provider, kind=kind,
                    fingerprint=ledger.fingerprint(payload), marker_sent=marker_sent,
                )  # fmt: skip
        return self.intent.marker

    def unanswered(self, error: BaseException) -> None:
        if self.intent is None:
            return
        state = ledger.CreateState.AMBIGUOUS if create_may_exist(error) else ledger.CreateState.REFUSED
        try:
            with self.engine.begin() as conn:
                ledger.record_outcome(conn, self.intent.id, state, f"{type(error).__name__}: {error}")
        except Exception:  # the create's own error is the one to raise; the row stays 'sending'
            log.exception("job %s: could not record the %s create as %s", self.job_id, self.kind, state)

    def __call__(self, task_id: str) -> None:
        job_uuid, kind = self.job_id, self.kind
        eng = self.engine
        if not isinstance(task_id, str) or not task_id.strip():
            raise ValueError(f"provider task id must be a non-empty string, got {task_id!r}")
        contract.require(eng)
        with eng.begin() as conn:
            ledger.record_task(
                conn, job_uuid, provider=str(get_kind(kind).provider), kind=kind, task_id=task_id,
                create=None if self.intent is None else self.intent.id,
            )  # fmt: skip
        crash_point("worker.after_create")
        with eng.begin() as conn:
            # recon.attach_task: the guarded write, and the credit anomaly of a task nobody will
            # answer for (the row ended while we created) or of a duplicate (another attempt's).
            answer = contract.call(conn, "attach_task", job=str(job_uuid), kind=kind, task_id=task_id)
        crash_point("worker.after_persist")
        raise_unless_poll(job_uuid, kind, task_id, answer)


def raise_unless_poll(job_uuid: uuid.UUID, kind: str, task_id: str, answer: dict[str, Any]) -> None:
    """What ``recon.attach_task`` answered, as the library's exceptions: nothing for ``poll``."""
    contract.fix_call(answer)
    if answer["next"] == "poll":
        return
    if answer["next"] == "resume":  # two attempts both created upstream; ours is an orphan
        raise TaskAlreadyPersisted(job_uuid, str(answer["task_id"]), task_id)
    if answer.get("reason") == "job_not_found":
        raise JobNotFound(f"job {job_uuid} does not exist")
    # The upstream task exists and may bill, but the row's credits are already settled; the
    # ledger holds it: the orphan sweep cancels it.
    log.error(
        "job %s is %s but upstream %s task %s was created for it; not persisted",
        job_uuid, answer.get("status"), kind, task_id,
    )  # fmt: skip
    raise JobNoLongerInFlight(job_uuid, str(answer.get("status")))


def create_may_exist(error: BaseException) -> bool:
    """Whether a create that raised ``error`` may still have made a task upstream: its answer
    was lost or unreadable (or the error is not one of ours). Not sent, or refused by an error
    answer: no task."""
    if isinstance(error, AmbiguousCreateError | ProviderProtocolError):
        return True
    return not isinstance(error, ProviderHTTPError | ValueError | ProviderConfigError)


def make_on_task_created(
    job_id: uuid.UUID | str, kind: str, *, engine: sa.Engine | None = None
) -> TaskCreatedRecorder:
    """Build the callback that persists the upstream task id the moment it exists (in the create
    ledger, then on the job's row)."""
    get_kind(kind)  # an unknown kind is a programming error: fail before any upstream call
    return TaskCreatedRecorder(uuid.UUID(str(job_id)), kind, engine)


def mark_provider_call_start(job_id: uuid.UUID | str, kind: str, *, engine: sa.Engine | None = None) -> None:
    """Sync routes: record kind and start time before the call. Never touches status (5.8)."""
    get_kind(kind)
    job_uuid = uuid.UUID(str(job_id))
    eng = engine or get_engine()
    contract.require(eng)
    with eng.begin() as conn:
        answer = contract.call(conn, "mark_call_start", job=str(job_uuid), kind=kind)
    contract.fix_call(answer)
    if answer["next"] != "call":
        _stop(job_uuid, answer)


def _stop(job_uuid: uuid.UUID, answer: dict[str, Any]) -> NoReturn:
    if answer.get("reason") == "job_not_found":
        raise JobNotFound(f"job {job_uuid} does not exist")
    raise JobNoLongerInFlight(job_uuid, str(answer.get("status")))


def run_or_resume(
    job_id: uuid.UUID | str,
    kind: str,
    create_and_run: Callable[[OnTaskCreated], UpstreamStatus],
    *,
    providers: Resumer,
    engine: sa.Engine | None = None,
) -> UpstreamStatus:
    """Resume the persisted upstream task if there is one; otherwise create it with the callback.

    ``create_and_run(on_task_created)`` is the worker's normal call, e.g.
    ``lambda cb: kie.run("kie-standard", payload, on_task_created=cb)``.
    """
    spec = get_kind(kind)
    eng = engine or get_engine()
    job_uuid = uuid.UUID(str(job_id))
    contract.require(eng)
    with eng.connect() as conn:
        point = contract.call(conn, "resume_point", job=str(job_uuid))
    if point["next"] == "stop":
        # Missing, or swept, cancelled or finished while it waited: neither create nor resume.
        _stop(job_uuid, point)
    if point["next"] == "resume" and spec.is_async:  # a sync kind has no task to resume
        resume_kind = point.get("kind") or kind
        task_id = str(point["task_id"])
        log.info("job %s: resuming persisted %s task %s (no new create)", job_uuid, resume_kind, task_id)
        return providers.resume(resume_kind, task_id)
    # The row names no task; an earlier attempt's create may still have made one (its worker
    # died between the send and the answer, or the answer was lost): CreateMayExist, not a create.
    open_create(job_uuid, engine=eng)
    try:
        return create_and_run(TaskCreatedRecorder(job_uuid, kind, eng, opened=True))
    except TaskAlreadyPersisted as dup:
        log.warning("%s; resuming the persisted task", dup)
        return providers.resume(kind, dup.persisted)
