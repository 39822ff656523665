"""Runs that died because their worker went away: a deploy's, never the provider's or the data's.

A code server restarted under its runs (a deploy), a run worker killed, a run that could not start
while its code server was away: none of these says anything about a provider or a job, and each of
the run's jobs is given back (``release_failed_run_leases``, ``fail_vanished_runs``) and retaken at
the next tick with no attempt counted. So such a failed run opens no alert and counts for no open
one. What does page is the loop: runs of one job (and provider) that keep dying this way for
``LOOP_S`` with none succeeding in between (a code server that crashes at every start, a worker
killed every time) page once, under the same ``runs:<job>:<provider>`` incident a failing run
opens, and resolve with the next run of it that succeeds.

A failed run is *interrupted* when Dagster says its worker ended unexpectedly
(``dagster/failure_reason`` ``UNEXPECTED_TERMINATION``: SIGTERM reached the worker;
``RUN_WORKER_RESTART``; ``START_TIMEOUT``: it never started), when ``fail_vanished_runs`` failed it
(``recon/interrupted``), or when something other than its worker marked it failed without any of
its steps failing (no failure reason at all: the code server's "run execution process ... was
terminated by signal 9", the run queue failing a launch its code server never answered, run
monitoring's "run worker crashed"). A step that failed, a resource that would not initialise or an
exception in the run is never an interruption: it pages as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg
from dagster._core.storage.tags import RUN_FAILURE_REASON_TAG

from recon_dagster.core.runtags import INTERRUPTED_TAG, PROVIDER_TAG

# Dagster's reasons that mean the worker went away rather than the run's code failing.
WORKER_REASONS = frozenset({"UNEXPECTED_TERMINATION", "RUN_WORKER_RESTART", "START_TIMEOUT"})
# Interrupted runs of one job and provider, with no success in between, for this long: a loop.
# One deploy kills its runs within seconds (a STARTING one times out 180 s later, run monitoring's
# start timeout): well inside this.
LOOP_S = 600.0
# ... and at least this many of them (three deploys in ten minutes with nothing succeeding is a loop
# too; two are two deploys).
LOOP_RUNS = 3
# How far back the loop is looked for (runs of one job and provider).
LOOK_BACK_RUNS = 200


@dataclass(frozen=True)
class Loop:
    """Runs of one job and provider that keep dying: how many, since when."""

    runs: int
    since: float


def interrupted_reason(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str | None:
    """Why ``run`` (failed) was interrupted, in a few words; None when it failed on its own."""
    ours = run.tags.get(INTERRUPTED_TAG)
    if ours:
        return ours
    reason = run.tags.get(RUN_FAILURE_REASON_TAG)
    if reason in WORKER_REASONS:
        return str(reason).lower()
    if reason:
        return None  # STEP_FAILURE, JOB_INITIALIZATION_FAILURE, RUN_EXCEPTION: the run's own
    # Marked failed from outside its worker: an interruption unless one of its steps had failed.
    if instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        return None
    return "worker_ended"


def restart_loop(instance: dg.DagsterInstance, run: dg.DagsterRun, ended: float) -> Loop | None:
    """The loop ``run`` (interrupted, ended at ``ended``) is part of, if its job's runs (with its
    provider) have all been interrupted for ``LOOP_S`` or more since the last one that succeeded."""
    provider = run.tags.get(PROVIDER_TAG)
    records = instance.get_run_records(
        filters=dg.RunsFilter(
            job_name=run.job_name,
            statuses=[dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE],
            tags={PROVIDER_TAG: provider} if provider else {},
        ),
        limit=LOOK_BACK_RUNS,
    )
    streak: list[float] = []
    for record in sorted(records, key=lambda r: r.end_time or 0.0, reverse=True):
        end = record.end_time or 0.0
        if end > ended + 0.001:
            continue  # after this run: not what this run's moment knew
        other = record.dagster_run
        if other.status is dg.DagsterRunStatus.SUCCESS:
            break
        if other.run_id != run.run_id and interrupted_reason(instance, other) is None:
            break  # a failure of its own: it paged (or pages) for itself
        streak.append(end)
    if len(streak) >= LOOP_RUNS and ended - min(streak) >= LOOP_S:
        return Loop(len(streak), min(streak))
    return None


def loop_line(loop: Loop, at: float, interrupted: str | None, reason: str) -> str:
    """The loop's one line: how many runs died, over how long, and the last one's reason."""
    span = at - loop.since
    over = f"{span / 60:.0f} min" if span >= 120 else f"{span:.0f} s"
    return (
        f"{loop.runs} runs in a row ended without their worker ({interrupted}) over {over}, none "
        f"succeeded since: is a code server or run worker restarting in a loop? last: {reason}"
    )
