"""The terminal paths every writer shares: ``finalize_job_with_media`` (spec 5.4, D6) and the
failure paths ``fail_and_refund`` / ``force_fail_and_refund`` / ``sweep_no_recovery`` (5.5, 5.6).

Phases, Stripe-idempotency style:

1. *read* (no transaction held): load the row, bail if it is already terminal; look up the
   reservation (D7).
   A result from another upstream task than the row's is refused here, before any download.
2. *media* (outside any transaction, idempotent): stream each result into the ``MediaStore`` under a
   key derived from the job id and the task, so a repeat of the same result (worker racing the
   reconciler, a late webhook) overwrites the same object instead of adding one, and another
   task's result never lands on an object the winner references.
3. *settle* (one transaction): the guarded completion, the credit commit, the asset row, the
   completion event, the sole-cause workflow reopen and the LoRA character update. If the guarded
   completion finds zero rows, nothing else in the transaction happens: ``ok=False``. The first
   four go to the database as one statement (``settle_completion``).

The spec lists steps 4-8 as separate writes; here they commit together, so a crash between the
completion and the credit commit cannot leave a completed job with credits reserved forever.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import httpx
import sqlalchemy as sa

from recon_dagster.core.crashpoints import crash_point
from recon_dagster.core.deadlines import media_deadline_s, media_min_bytes_per_s
from recon_dagster.core.kinds import KINDS
from recon_dagster.db import credits
from recon_dagster.db import jobs as jobs_db
from recon_dagster.db.sqltext import sql
from recon_dagster.media.base import media_folder
from recon_dagster.media.content import promised_kind
from recon_dagster.media.egress import new_media_client
from recon_dagster.media.errors import MediaNotImage, MediaNotVideo, MediaUnusable
from recon_dagster.media.store import MediaStore, StoredObject, guess_ext, media_key
from recon_dagster.media.transfer import fetch_media_to_store
from recon_dagster.media.video_limits import VideoBudget, VideoLimits
from recon_dagster.providers.status import MediaRef, UpstreamState, UpstreamStatus
from recon_dagster.reconcile.completion import reopen_sole_cause_workflow, settle_completion
from recon_dagster.reconcile.decide import foreign_task, unusable_result
from recon_dagster.reconcile.decide import promised_kind as promised_by_job
from recon_dagster.telemetry.instruments import CREDITS_REFUNDED, CREDITS_REFUNDED_AMOUNT, add_on_commit
from recon_dagster.telemetry.tracing import span

log = logging.getLogger("recon_dagster.finalize")

DEFAULT_MAX_MEDIA_BYTES = 2 * 1024**3
DEFAULT_MAX_IMAGE_BYTES = 64 * 1024**2

_media_client: tuple[int, httpx.Client] | None = None
_media_client_lock = threading.Lock()


def shared_media_client() -> httpx.Client:
    """The process's media-download client, created once.

    A new ``httpx.Client`` per download cost about 18 ms of CPU (its TLS context), more than the
    rest of a reconciled job together. Keep-alive is off: a pooled connection opened to one pinned
    address with one TLS name must never carry a request for another host on the same address.
    """
    global _media_client
    with _media_client_lock:
        # A forked child (pid differs) must not share its parent's sockets.
        if _media_client is None or _media_client[0] != os.getpid():
            _media_client = (os.getpid(), new_media_client())
        return _media_client[1]


_DEFAULT_EXT = {"image": "png", "video": "mp4", "audio": "mp3", "weights": "tar", "file": "bin"}


@dataclass(frozen=True)
class ProviderResult:
    """What a finished upstream call produced: the input of ``finalize_job_with_media``."""

    provider_kind: str
    media: tuple[MediaRef, ...] = ()
    cost_usd: float | None = None
    result: dict[str, Any] | None = None
    task_id: str | None = None
    display_cost: float | None = None

    @classmethod
    def from_status(cls, status: UpstreamStatus) -> ProviderResult:
        if status.state is not UpstreamState.SUCCEEDED:
            raise ValueError(f"cannot finalize from upstream state {status.state.value!r}")
        return cls(status.provider_kind, status.media, status.cost_usd, status.result, status.task_id)

    @property
    def provider(self) -> str:
        """The registry's provider of the kind (a kind it does not know stands for itself)."""
        kind = KINDS.get(self.provider_kind)
        return kind.provider if kind is not None else self.provider_kind


class HeadersFor(Protocol):
    def __call__(self, kind: str, ref: MediaRef) -> Mapping[str, str]: ...


class SlotFor(Protocol):
    """What a download of ``ref`` holds while it lasts (the account's slot for a provider's own
    byte endpoint: ``ProvidersResource.media_slot``)."""

    def __call__(self, kind: str, ref: MediaRef) -> AbstractContextManager[None]: ...


@dataclass(frozen=True)
class MediaPolicy:
    """How media is fetched: caps, the SSRF allow-list, and auth headers for byte endpoints."""

    # None: RECON_MEDIA_ALLOWED_HOSTS from the environment.
    allowed_hosts: frozenset[str] | None = None
    max_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    headers_for: HeadersFor | None = None
    slot_for: SlotFor | None = None
    watermark_text: str = "recon"
    # All media of one finalize together (None: RECON_MEDIA_DEADLINE_S, 600 s: inside the lease);
    # an object that declares its size gets its share at min_bytes_per_s
    # (None: RECON_MEDIA_MIN_BYTES_PER_S, 1 MiB/s).
    deadline_s: float | None = None
    min_bytes_per_s: float | None = None
    # Bounds on re-encoding the job's videos (None: RECON_VIDEO_MAX_DURATION_S, _FRAMES, _PIXELS
    # and RECON_VIDEO_ENCODE_DEADLINE_S).
    video_limits: VideoLimits | None = None


class UnusableResult(ValueError):
    """A success that does not carry what the job promised (media for a media job, or anything at
    all). Nothing is completed or charged; the caller counts a failed attempt, so the attempt cap
    still ends the job with a refund."""

    def __init__(self, job_id: uuid.UUID, provider_kind: str, problem: str) -> None:
        super().__init__(f"{provider_kind} job {job_id}: {problem}; not completed, nothing charged")
        self.problem = problem


class ForeignTaskResult(UnusableResult):
    """The result comes from another upstream task than the row's ``provider_task_id`` (an orphan
    duplicate task, a stray webhook): it never touches the row's media or money. Refused with a
    ``foreign_task_result`` credit anomaly naming both tasks; the job is neither completed nor
    failed by it (the row's own task can still complete it)."""

    def __init__(self, job_id: uuid.UUID, provider_kind: str, row_task: str, result_task: str | None) -> None:
        super().__init__(
            job_id, provider_kind, f"result of task {result_task}, but the row's task is {row_task}"
        )
        self.row_task = row_task
        self.result_task = result_task


def _refuse_foreign(
    engine: sa.Engine, row: jobs_db.JobRow, row_task: str, result: ProviderResult, source: str
) -> NoReturn:
    """Record the ``foreign_task_result`` anomaly (in its own transaction), then raise."""
    with engine.begin() as conn:
        credits.log_credit_anomaly(
            conn,
            job_id=row.id,
            user_id=row.user_id,
            reason="foreign_task_result",
            details={
                "row_task_id": row_task,
                "result_task_id": result.task_id,
                "provider_kind": result.provider_kind,
                "source": source,
            },
        )
    raise ForeignTaskResult(row.id, result.provider_kind, row_task, result.task_id)


def _task_of(row: jobs_db.JobRow, result: ProviderResult) -> str | None:
    """The upstream task whose result this is: the result's own id, else the row's."""
    return result.task_id or row.provider_task_id


def _require_usable(row: jobs_db.JobRow, result: ProviderResult, media: int) -> None:
    problem = unusable_result(
        media=media, result=result.result, promised=promised_by_job(result.provider_kind, row.job_type)
    )
    if problem is not None:
        raise UnusableResult(row.id, result.provider_kind, problem)


@dataclass
class FinalizeResult:
    ok: bool
    reason: str
    stored: list[StoredObject] = field(default_factory=list)
    credits_committed: bool = False
    asset_created: bool = False
    workflow_reopened: bool = False
    character_updated: bool = False
    duration_ms: int = 0
    # Keys this attempt wrote and removed again because it lost to a cancel or a failure.
    discarded: list[str] = field(default_factory=list)


def finalize_job_with_media(
    engine: sa.Engine,
    store: MediaStore,
    job_id: uuid.UUID | str,
    result: ProviderResult,
    *,
    source: str,
    policy: MediaPolicy | None = None,
    snapshot: jobs_db.RowAndReservation | None = None,
) -> FinalizeResult:
    """The one success path shared by workers, webhooks and reconciliation (spec 5.4).

    Returns ``ok=False`` without side effects on the row when it is already terminal or another
    writer wins the guarded completion; media errors (an expired signed URL, a refused host)
    propagate so the caller counts a failed attempt instead of completing the row without media.
    A success without the media the job promised (or without anything) raises ``UnusableResult``
    the same way: a success is charged only with the media it promised, stored. A result from
    another task than the row's raises ``ForeignTaskResult`` (an ``UnusableResult``) before any
    download, or at the settle if the row was given its task meanwhile.

    ``snapshot``: the row and its reservation as the caller read them (the reconciler reads a
    whole batch's in one statement when it renews its lease before acting), so phase 1 reads
    nothing. Safe because phase 1 decides nothing final: the settle is the same guarded
    compare-and-set either way, and a row another writer finished since the snapshot loses
    there (``ok=False``, this attempt's media discarded) instead of before the download.
    """
    policy = policy or MediaPolicy()
    started = time.monotonic()
    job_id = uuid.UUID(str(job_id))

    # Phase 1: read (the row and its reservation in one statement), unless the caller did.
    row: jobs_db.JobRow | None
    if snapshot is not None and snapshot[0].id == job_id:
        row, reservation = snapshot
    else:
        with engine.connect() as conn:
            row, reservation = jobs_db.load_job_and_reservation(conn, job_id)
    if row is None:
        return FinalizeResult(False, "job not found")
    if not row.inflight:
        return FinalizeResult(False, f"already {row.status}")
    # The checks of decide.refused_before_download (the plan and shadow apply them too).
    if row.provider_task_id is not None and foreign_task(row.provider_task_id, result.task_id):
        _refuse_foreign(engine, row, row.provider_task_id, result, source)
    _require_usable(row, result, len(result.media))

    # Phase 2: media (the row's own should_watermark, never the user's current tier).
    watermark = watermark_required(row)
    try:
        with span("download", {"recon.job_id": str(row.id), "recon.media_count": len(result.media)}):
            stored = store_result_media(store, row, result, should_watermark=watermark, policy=policy)
    except MediaUnusable as exc:
        raise UnusableResult(row.id, result.provider_kind, exc.reason()) from None
    except (MediaNotImage, MediaNotVideo) as exc:
        _watermark_failed(engine, row, result, exc)
        raise UnusableResult(row.id, result.provider_kind, str(exc)) from None
    _require_usable(row, result, len(stored))
    crash_point("finalize.after_upload")

    # Phase 3: settle: the completion, the credit commit and the asset in one statement.
    out = FinalizeResult(False, "", stored=stored)
    with engine.begin() as conn:
        settled = settle_completion(
            conn,
            row,
            task_id=result.task_id,
            output_data=_output_data(result, stored, source, task=_task_of(row, result)),
            provider=result.provider,
            provider_cost=result.cost_usd,
            display_cost=result.display_cost
            if result.display_cost is not None
            else (
                float(amount)
                if reservation and (amount := credits.valid_amount(reservation.amount)) is not None
                else None
            ),
            notify_source=source,  # the completion event, sent by the won write itself
            asset=_primary(stored, watermark),
            provider_kind=result.provider_kind,
        )
        if not settled.won:
            _settle_lost(engine, conn, store, row, result, source, out)
            out.duration_ms = _ms(started)
            return out
        out.ok = True
        out.reason = "completed"
        out.credits_committed = settled.usage_log_id is not None
        out.asset_created = settled.asset_created
        if row.workflow_execution_id is not None and row.node_id is not None:
            out.workflow_reopened = reopen_sole_cause_workflow(conn, row.workflow_execution_id, row.node_id)
        out.character_updated = _character_ready(conn, job_id, stored, result)
        crash_point("finalize.in_settle")
    crash_point("finalize.after_commit")
    out.duration_ms = _ms(started)
    return out


def _settle_lost(
    engine: sa.Engine,
    conn: sa.Connection,
    store: MediaStore,
    row: jobs_db.JobRow,
    result: ProviderResult,
    source: str,
    out: FinalizeResult,
) -> None:
    """The guarded completion found zero rows: remove what this attempt stored unless the winner
    references it. A row still in flight was given another task between the read and the settle:
    ``ForeignTaskResult``."""
    status, refs, row_task = _winner(conn, row.id)
    out.discarded = _discard_losing_media(store, row.id, out.stored, status, refs)
    if status in jobs_db.INFLIGHT_STATUSES and row_task is not None:
        _refuse_foreign(engine, row, row_task, result, source)
    out.reason = "another writer finished the job first"


def _watermark_failed(
    engine: sa.Engine, row: jobs_db.JobRow, result: ProviderResult, exc: MediaNotImage | MediaNotVideo
) -> None:
    """A watermark row whose media cannot be watermarked is never completed with the clean
    original: the caller counts an attempt, and one ``watermark_failed`` anomaly names the job."""
    with engine.begin() as conn:
        credits.log_credit_anomaly(
            conn,
            job_id=row.id,
            user_id=row.user_id,
            reason="watermark_failed",
            details={
                "error": str(exc)[:2000],
                "provider_kind": result.provider_kind,
                "provider_task_id": row.provider_task_id,
            },
        )


def watermark_required(row: jobs_db.JobRow) -> bool:
    """The row's own ``should_watermark``; NULL is the free-tier default: watermark."""
    return row.should_watermark is not False


def store_result_media(
    store: MediaStore,
    row: jobs_db.JobRow,
    result: ProviderResult,
    *,
    should_watermark: bool,
    policy: MediaPolicy,
) -> list[StoredObject]:
    """Stream every media reference into the store under the job's deterministic keys for this
    task (``media_key``), all of them within the policy's overall deadline.

    Where the row says watermark, an image or a video is stored only as its watermarked variant:
    the clean original is never written, so no key or URL of it can reach output_data, assets or
    logs. Audio is stored as it came. A body that cannot be the promised media (empty, an error
    page, an encoded body) raises ``MediaUnusable`` before anything is stored.
    """
    out: list[StoredObject] = []
    task = _task_of(row, result)  # keys per task: another task's result never shares one
    budget_s = policy.deadline_s if policy.deadline_s is not None else media_deadline_s()
    rate = policy.min_bytes_per_s if policy.min_bytes_per_s is not None else media_min_bytes_per_s()
    deadline = time.monotonic() + budget_s
    # One budget for all the job's videos: hours of tiny frames end here, not past the lease.
    videos = VideoBudget(policy.video_limits, deadline=deadline)
    for index, ref in enumerate(result.media):
        headers = (
            dict(policy.headers_for(result.provider_kind, ref))
            if ref.needs_auth and policy.headers_for
            else None
        )

        def key_for(content_type: str, variant: str | None, i: int = index, r: MediaRef = ref) -> str:
            return media_key(row.id, row.job_type, i, _ext(content_type, r), variant=variant, task=task)

        # A download from the provider's own API is a request on the account: it holds the
        # account's slot (and waits for its read token) for as long as the bytes flow.
        slot = (
            policy.slot_for(result.provider_kind, ref)
            if ref.needs_auth and policy.slot_for
            else nullcontext()
        )
        with slot:
            out.append(
                fetch_media_to_store(
                    ref.url,
                    store,
                    key_for,
                    promised=promised_kind(ref.kind, media_folder(row.job_type)),
                    watermark_text=policy.watermark_text if should_watermark else None,
                    max_bytes=policy.max_bytes,
                    max_image_bytes=policy.max_image_bytes,
                    allowed_hosts=policy.allowed_hosts,
                    headers=headers,
                    client=shared_media_client(),
                    deadline_s=max(0.0, deadline - time.monotonic()),
                    min_bytes_per_s=rate,
                    video_budget=videos,
                )
            )
    return out


def media_to_discard(stored_keys: list[str], winner_status: str | None, winner_refs: str) -> list[str]:
    """Which objects a losing finalize wrote must go (pure).

    Keys are deterministic per job and task, so a completed winner of the same task references the
    very objects this attempt rewrote: every key its output or asset names (``winner_refs``, their
    text) stays. Another task's keys are never the winner's, so they all go.
    Against a cancel, a failure or a vanished row nothing references them: all go.
    """
    if winner_status == "completed":
        return [k for k in stored_keys if k not in winner_refs]
    return list(stored_keys)


def _winner(conn: sa.Connection, job_id: uuid.UUID) -> tuple[str | None, str, str | None]:
    """The row's final status, the text of everything that may reference its media, and its task."""
    r = conn.execute(
        sql(
            """
            SELECT j.status, j.provider_task_id, coalesce(j.output_data::text, '') || ' ' || coalesce(
              (SELECT string_agg(concat_ws(' ', a.storage_key, a.url), ' ') FROM assets a WHERE a.job_id = j.id),
              '') AS refs
            FROM jobs j WHERE j.id = :id
            """
        ),
        {"id": str(job_id)},
    ).first()
    return (None, "", None) if r is None else (r.status, r.refs, r.provider_task_id)


def _discard_losing_media(
    store: MediaStore, job_id: uuid.UUID, stored: list[StoredObject], winner_status: str | None, refs: str
) -> list[str]:
    """Delete what ``media_to_discard`` names; a failing delete is logged, never raised."""
    gone: list[str] = []
    for key in media_to_discard([o.key for o in stored], winner_status, refs):
        try:
            store.delete(key)
            gone.append(key)
        except Exception:
            log.exception("job %s: could not delete media %s of a finalize that lost", job_id, key)
    return gone


@dataclass(frozen=True)
class Failed:
    """A guarded fail that won, and the refund it made (None: nothing was reserved any more)."""

    refund: credits.Refund | None


def fail_and_refund(
    engine: sa.Engine, job_id: uuid.UUID | str, error_message: str, *, kind: str | None = None
) -> bool:
    """Guarded fail, then the reservation back to its pools, in one transaction.

    False: the row was already terminal; nothing was refunded by this call. ``kind`` labels the
    refund's metrics only.
    """
    job_id = uuid.UUID(str(job_id))
    with engine.begin() as conn:
        return _fail_and_refund(conn, job_id, error_message, kind) is not None


def force_fail_and_refund(
    engine: sa.Engine,
    job_id: uuid.UUID | str,
    *,
    attempts: int,
    last_error: str | None,
    kind: str | None = None,
) -> bool:
    """Attempts exhausted: fail, refund, and leave a ``reconcile_exhausted`` credit anomaly."""
    job_id = uuid.UUID(str(job_id))
    with engine.begin() as conn:
        failed = _fail_and_refund(
            conn, job_id, f"reconcile_exhausted: {attempts} attempts; last error: {last_error or '-'}", kind
        )
        if failed is None:
            return False
        row = jobs_db.load_job(conn, job_id)
        credits.log_credit_anomaly(
            conn,
            job_id=job_id,
            user_id=row.user_id if row else None,
            reason="reconcile_exhausted",
            amount=failed.refund.amount if failed.refund else None,
            details={
                "attempts": attempts,
                "last_error": last_error,
                "provider_kind": row.provider_kind if row else None,
                "provider_task_id": row.provider_task_id if row else None,
                "refunded": failed.refund is not None,
            },
        )
        return True


def sweep_no_recovery(engine: sa.Engine, job_id: uuid.UUID | str, *, kind: str | None = None) -> bool:
    """Spec 5.6: a stale sync / task-less / legacy row cannot be recovered: fail + refund."""
    return fail_and_refund(engine, job_id, "reconcile_no_recovery", kind=kind)


def _fail_and_refund(
    conn: sa.Connection, job_id: uuid.UUID, error_message: str, kind: str | None = None
) -> Failed | None:
    """None when the guarded fail lost (the row was already terminal): nothing else happens."""
    # The failure event goes out with the won write (same statement, delivered at COMMIT).
    if not jobs_db.fail_job(conn, job_id, error_message, notify_source="reconcile"):
        return None
    refund = credits.refund_reserved_credits_for_job(conn, job_id)
    if refund is not None:  # counted when the transaction commits
        add_on_commit(conn, CREDITS_REFUNDED, 1, kind=kind)
        add_on_commit(conn, CREDITS_REFUNDED_AMOUNT, float(refund.amount), kind=kind)
    _character_failed(conn, job_id, error_message)
    crash_point("refund.in_settle")
    return Failed(refund)


def _character_ready(
    conn: sa.Connection, job_id: uuid.UUID, stored: list[StoredObject], result: ProviderResult
) -> bool:
    if result.provider_kind != "replicate-training":
        return False
    weights = next((o.url for o in stored), None) or _weights_url(result)
    r = conn.execute(
        sql(
            """
            UPDATE characters SET training_status = 'ready', lora_weights_url = :w,
              error_message = NULL, updated_at = now()
            WHERE training_job_id = :j AND training_status IN ('pending', 'training')
            RETURNING id
            """
        ),
        {"j": str(job_id), "w": weights},
    ).first()
    return r is not None


def _character_failed(conn: sa.Connection, job_id: uuid.UUID, error_message: str) -> None:
    conn.execute(
        sql(
            """
            UPDATE characters SET training_status = 'failed', error_message = :e, updated_at = now()
            WHERE training_job_id = :j AND training_status IN ('pending', 'training')
            """
        ),
        {"j": str(job_id), "e": error_message},
    )


def _weights_url(result: ProviderResult) -> str | None:
    return next((m.url for m in result.media if m.kind == "weights"), None)


def _primary(stored: list[StoredObject], watermarked: bool) -> StoredObject | None:
    if not stored:
        return None
    if watermarked:
        for obj in stored:
            if ".watermarked." in obj.key:
                return obj
    return stored[0]


def _output_data(
    result: ProviderResult, stored: list[StoredObject], source: str, *, task: str | None
) -> dict[str, Any]:
    return {
        "media": [{"key": o.key, "url": o.url, "size": o.size, "sha256": o.sha256} for o in stored],
        "result": result.result,
        "provider_kind": result.provider_kind,
        "provider_task_id": task,
        "finalized_by": source,
    }


def _ext(content_type: str, ref: MediaRef) -> str:
    return guess_ext(content_type, ref.url, default=_DEFAULT_EXT.get(ref.kind, "bin"))


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
