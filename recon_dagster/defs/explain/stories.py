"""``job_story``: each worked job's story on a page of its own, without launching a run.

One partition per job id (a dynamic partition, ``recon_job``). Every reconcile or sweep run records
the story of each job it failed, swept or could not get on with (``worked_jobs``: not a job it
completed, nor one whose poll said "still running" far from the cap; at most ``STORIES_PER_RUN``,
the worst first), and every operator action its job's, as a
materialization of that job's partition (``record_stories``): the facts an on-call reads first as metadata, the whole story
(``operator.explain.to_markdown``: attempts numbered ``#n``, operator actions ``op n``) behind
one click. ``stuck_jobs`` links each row to it (``story_url``), and a run's log links each story
it recorded, so a job's story is two clicks from a stuck row or a run.

The story read here skips the run-id lookups ``explain`` makes in the instance (the attempts
since migration 141 carry their run id): a run records its jobs' stories in a few queries each.
A story that cannot be read is logged and never fails the run's work.
"""

from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import dagster as dg
import sqlalchemy as sa

from recon_dagster.config import settings
from recon_dagster.operator.explain import facts, load_story, numbers, to_markdown, ui_base_url

PARTITIONS = "recon_job"
JOBS = dg.DynamicPartitionsDefinition(name=PARTITIONS)
JOB_STORY = dg.AssetKey("job_story")
# The facts shown on the partition's page without a click (the rest is in ``story``).
_SHOWN = ("outcome", "status", "provider kind", "provider task id", "upstream said last", "credits")

job_story = dg.AssetSpec(
    JOB_STORY,
    partitions_def=JOBS,
    group_name="reconciliation",
    description="One page per job that reconciliation or an operator worked (partition = the job id): "
    "its outcome, the last upstream answer, its credits and its whole story (every attempt #n with "
    "its run, operator actions op n, the create ledger). Recorded by the run that worked the job; "
    "open it from a stuck_jobs row's story link or a run's log.",
)


def story_url(job_id: str, base: str | None) -> str:
    """The job's ``job_story`` partition page."""
    return f"{base or ''}/assets/job_story?view=partitions&partition={quote(str(job_id), safe='')}"


def story_metadata(engine: sa.Engine, job_id: str, base: str | None) -> dict[str, Any]:
    story = load_story(engine, job_id)
    shown = dict(facts(story))
    marks = numbers(story)
    return {
        **{k: shown[k] for k in _SHOWN if k in shown},
        "reconcile attempts": story.reconcile_attempts,
        "operator actions": sum(m.startswith("op") for m in marks),
        "story": dg.MetadataValue.md(to_markdown(story, base)),
    }


# At most this many stories a run records: each costs Dagster an event write (~0.1 s on a shared
# machine, ``benchmarks/job_stories.py``), and a run of 2,000 jobs in an outage must not spend
# minutes on pages. The worst first (force-failed at the cap, failed, swept, then the ones it
# could not get on with); the rest get theirs at a later run, and ``explain`` tells any job's.
STORIES_PER_RUN = 50
_ORDER = ("exhausted", "failed", "swept", "our_fault", "error", "still_running")


def worked_jobs(
    outcomes: Iterable[Any], *, cap: int | None = None, near: int = 2, limit: int = STORIES_PER_RUN
) -> list[object]:
    """The jobs whose story a run records: each job it force-failed, failed or swept, or could not
    get on with (no answer, our fault, near the cap), at most ``limit``, the worst first. Not a job
    it completed (the app's result says all; a page for each would be one partition per generation
    in the instance), nor one whose poll the provider answered "still running" far from the cap
    (the steady state of most jobs in flight), nor one it skipped, never polled or lost."""
    cap_at = cap if cap is not None else settings().max_attempts
    chosen: list[tuple[int, object]] = []
    for o in outcomes:
        outcome = str(getattr(o.outcome, "value", o.outcome))
        cause = str(getattr(o.cause, "value", o.cause))
        if outcome not in _ORDER:
            continue  # recovered, skipped, not_sent, lost_race
        if outcome == "still_running" and cause == "answered" and o.attempt < cap_at - near:
            continue
        chosen.append((_ORDER.index(outcome), o.job_id))
    chosen.sort(key=lambda pair: pair[0])  # stable: within a rank, the run's order
    return [job_id for _, job_id in chosen[: max(limit, 0)]]


def record_stories(context: dg.OpExecutionContext, engine: sa.Engine, job_ids: Iterable[object]) -> int:
    """Record the story of each of ``job_ids`` as its ``job_story`` partition; how many were.
    Never raises: the run's work is done and recorded already."""
    ids = sorted({str(j) for j in job_ids})
    if not ids:
        return 0
    base = ui_base_url(None)
    try:
        context.instance.add_dynamic_partitions(PARTITIONS, ids)
    except Exception as exc:
        context.log.warning(f"job stories not recorded (partitions: {type(exc).__name__}: {exc})")
        return 0
    done = 0
    for job_id in ids:
        try:
            metadata = story_metadata(engine, job_id, base)
        except Exception as exc:
            context.log.warning(f"story of job {job_id} not recorded: {type(exc).__name__}: {exc}")
            continue
        context.log_event(dg.AssetMaterialization(asset_key=JOB_STORY, partition=job_id, metadata=metadata))
        done += 1
    return done
