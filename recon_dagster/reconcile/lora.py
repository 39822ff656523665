"""The LoRA-training migration (spec D3, Phase 3, section 7): character trainings move from the
legacy ``reconcileOrphanedTrainings`` cron onto the one reconcile path as
``provider_kind = 'replicate-training'``.

Each cohort run does two things:

* *adopt*: a training the legacy code started has its Replicate training id on ``characters`` but
  none of migration 135's columns on its ``jobs`` row, so the sensor cannot see it. Adoption copies
  the id over with a guarded write (only rows still in flight with no task id), after which the
  sensor reconciles it like any other stale job.
* *shadow-compare*: for trainings the new path itself settled, ask Replicate what the legacy cron
  would have decided and compare. Zero mismatches over a cohort is the spec's "verified on one
  cohort" that lets the legacy cron be deleted.

"The new path settled it" is proven by reconciliation's own audit trail: a ``reconcile_events`` row
of that job whose outcome is a settle reconciliation won (recovered, failed, swept, exhausted). A
training the app's worker or webhook completed has none, whatever its status: it is no evidence
about the new path, and is only counted (``settled_elsewhere``) so the check can say so.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Protocol

import sqlalchemy as sa

from recon_dagster.providers.status import UpstreamState, UpstreamStatus
from recon_dagster.reconcile.decide import Outcome

KIND = "replicate-training"

# Outcomes of an attempt whose guarded terminal write reconciliation itself won.
SETTLED_BY_RECONCILE = (Outcome.RECOVERED, Outcome.FAILED, Outcome.SWEPT, Outcome.EXHAUSTED)


class TrainingPoller(Protocol):
    def poll(self, kind: str, task_id: str) -> UpstreamStatus: ...


@dataclass(frozen=True)
class Adopted:
    job_id: uuid.UUID
    character_id: uuid.UUID
    training_id: str


@dataclass(frozen=True)
class Comparison:
    character_id: uuid.UUID
    job_id: uuid.UUID
    training_id: str
    new_status: str
    legacy_status: str | None
    note: str = ""

    @property
    def matches(self) -> bool:
        return self.legacy_status is None or self.legacy_status == self.new_status


# The legacy cron may be retired only on this much evidence: at least this many settled trainings
# compared with what it would have decided, none different, and no legacy training it alone sees.
MIN_RETIREMENT_COHORT = 20


def retirement_blockers(
    compared: int, mismatches: int, orphans: int, settled_elsewhere: int = 0
) -> list[str]:
    """What still stands between the cohort and retiring the legacy cron (empty: nothing)."""
    blockers = []
    if compared < MIN_RETIREMENT_COHORT:
        blockers.append(f"only {compared} training(s) compared, {MIN_RETIREMENT_COHORT} needed")
        if settled_elsewhere:
            # Named, so a cohort that looks big enough in the table says why it does not count.
            blockers.append(
                f"{settled_elsewhere} settled training(s) have no reconcile event (settled by the app's "
                "worker or webhook, not reconciliation): not counted"
            )
    if mismatches:
        blockers.append(f"{mismatches} training(s) settled differently from the legacy cron")
    if orphans:
        blockers.append(f"{orphans} legacy training(s) with no jobs row, which only the legacy cron sees")
    return blockers


def legacy_decision(status: UpstreamStatus) -> str | None:
    """What the legacy cron did with a training: ready on success, failed on failure or lost
    output, and nothing while it runs: the character stays 'training' (a settled character whose
    training still runs is therefore a mismatch, never "no opinion")."""
    match status.state:
        case UpstreamState.SUCCEEDED:
            return "ready"
        case UpstreamState.FAILED | UpstreamState.EXPIRED | UpstreamState.NOT_FOUND:
            return "failed"
        case UpstreamState.RUNNING:
            return "training"
    return None  # pragma: no cover


# In-flight legacy trainings with no task id on their job row, oldest first: what adoption takes.
_ADOPTABLE = """
  SELECT c.id, c.training_job_id, c.replicate_training_id, c.training_started_at, c.created_at
  FROM characters c JOIN jobs j ON j.id = c.training_job_id
  WHERE c.training_status IN ('pending', 'training') AND c.replicate_training_id IS NOT NULL
    AND j.provider_task_id IS NULL AND j.status IN ('pending', 'processing')
  ORDER BY c.created_at LIMIT :limit
"""


def adopt_legacy_trainings(conn: sa.Connection, limit: int = 500) -> list[Adopted]:
    """Give in-flight legacy trainings the columns the sensor needs; never overwrite a task id."""
    rows = conn.execute(
        sa.text(
            f"""
            UPDATE jobs j SET provider_kind = :kind,
              provider_task_id = c.replicate_training_id,
              provider_call_started_at = COALESCE(j.provider_call_started_at, c.training_started_at,
                                                  j.started_at, c.created_at),
              updated_at = now()
            FROM ({_ADOPTABLE}) c
            WHERE j.id = c.training_job_id AND j.provider_task_id IS NULL
              AND j.status IN ('pending', 'processing')
            RETURNING j.id AS job_id, c.id AS character_id, c.replicate_training_id AS training_id
            """
        ),
        {"kind": KIND, "limit": limit},
    )
    return [Adopted(uuid.UUID(str(r.job_id)), uuid.UUID(str(r.character_id)), r.training_id) for r in rows]


def adoptable_trainings(conn: sa.Connection, limit: int = 500) -> list[Adopted]:
    """What ``adopt_legacy_trainings`` would adopt now, read only (the training kind in shadow)."""
    rows = conn.execute(
        sa.text(
            f"SELECT c.training_job_id AS job_id, c.id AS character_id, c.replicate_training_id AS training_id FROM ({_ADOPTABLE}) c"
        ),
        {"limit": limit},
    )
    return [Adopted(uuid.UUID(str(r.job_id)), uuid.UUID(str(r.character_id)), r.training_id) for r in rows]


def orphan_trainings(conn: sa.Connection) -> int:
    """Legacy trainings with no jobs row at all: only the legacy cron can see these."""
    return int(
        conn.execute(
            sa.text(
                "SELECT count(*) FROM characters WHERE training_status IN ('pending', 'training') "
                "AND replicate_training_id IS NOT NULL AND training_job_id IS NULL"
            )
        ).scalar_one()
    )


@dataclass(frozen=True)
class Cohort:
    """Settled trainings: (character, job, training id, character status) of those reconciliation
    settled, and how many others (settled by another writer) were left out."""

    members: list[tuple[uuid.UUID, uuid.UUID, str, str]]
    settled_elsewhere: int


# A settled training of the new path: its character settled, its job terminal, and whether
# reconciliation's own audit trail (reconcile_events, one indexed probe per job) shows it won the
# settle (``:reconciled``: true for the cohort, false for the count of the others).
_SETTLED_SQL = """
FROM characters c JOIN jobs j ON j.id = c.training_job_id
WHERE j.provider_kind = :kind AND j.provider_task_id IS NOT NULL
  AND c.training_status IN ('ready', 'failed')
  AND j.status IN ('completed', 'failed')
  AND EXISTS (SELECT 1 FROM reconcile_events e
              WHERE e.job_id = j.id AND e.outcome = ANY(:outcomes)) = :reconciled
"""


def settled_cohort(conn: sa.Connection, limit: int = 200) -> Cohort:
    """Trainings the new path settled (newest first, bounded), and a count of the others."""
    params = {"kind": KIND, "outcomes": [o.value for o in SETTLED_BY_RECONCILE]}
    rows = conn.execute(
        sa.text(
            "SELECT c.id, j.id AS job_id, j.provider_task_id, c.training_status "
            + _SETTLED_SQL
            + " ORDER BY c.updated_at DESC LIMIT :limit"
        ),
        {**params, "reconciled": True, "limit": limit},
    )
    members = [
        (uuid.UUID(str(r.id)), uuid.UUID(str(r.job_id)), r.provider_task_id, r.training_status) for r in rows
    ]
    elsewhere = conn.execute(sa.text("SELECT count(*) " + _SETTLED_SQL), {**params, "reconciled": False})
    return Cohort(members, int(elsewhere.scalar_one()))


def _stopped_by_us(conn: sa.Connection, task_ids: list[str]) -> set[str]:
    """The trainings among ``task_ids`` the create ledger says we cancelled (or handed to the orphan
    sweep to cancel) after their job was force-failed."""
    if not task_ids:
        return set()
    rows = conn.execute(
        sa.text(
            "SELECT task_id FROM upstream_creates WHERE provider = 'replicate' AND task_id = ANY(:t) "
            "AND fate IN ('cancelled', 'handed_to_sweep')"
        ).bindparams(sa.bindparam("t", type_=sa.ARRAY(sa.Text))),
        {"t": task_ids},
    )
    return {str(r.task_id) for r in rows}


def shadow_compare(
    engine: sa.Engine, poller: TrainingPoller, limit: int = 200
) -> tuple[list[Comparison], int]:
    """Compare each training reconciliation settled with the legacy cron's decision; also returns
    how many settled trainings were left out (settled by another writer)."""
    with engine.connect() as conn:
        cohort = settled_cohort(conn, limit)
        stopped = _stopped_by_us(conn, [t for *_, t, _ in cohort.members])
    out: list[Comparison] = []
    for character_id, job_id, training_id, new_status in cohort.members:
        try:
            status = poller.poll(KIND, training_id)
            legacy, note = legacy_decision(status), ""
            if status.state is UpstreamState.RUNNING:
                note = "Replicate still reports the training running; the legacy cron would have left it training"
            elif training_id in stopped and status.state is not UpstreamState.SUCCEEDED:
                # Our own cancel (its job force-failed while it ran) ended it: the legacy cron,
                # which cancels nothing, would have left it training.
                legacy = "training"
                note = (
                    "recon_dagster cancelled it upstream when it force-failed the job while Replicate "
                    "still ran it; the legacy cron would have left it training"
                )
            if status.state is UpstreamState.EXPIRED:
                # Replicate drops outputs an hour after completion: no evidence either way now.
                legacy, note = None, "output already removed upstream; not comparable"
        except Exception as exc:  # a poll error is a gap in the evidence, not a mismatch
            legacy, note = None, f"poll failed: {type(exc).__name__}: {exc}"
        out.append(Comparison(character_id, job_id, training_id, new_status, legacy, note))
    return out, cohort.settled_elsewhere
