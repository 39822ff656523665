"""The tags of reconcile runs: what the Runs page filters on and the run queue limits by.

Every reconcile run carries ``recon/provider_kind`` and ``recon/provider`` however it was launched
(sensor, Launchpad, backfill, ``reconcile --once``): the per-provider run limits of
``dagster.yaml`` key on them. Each job a run works adds one tag of its own, so the Runs page's tag
filter finds every run that worked a job, batches included. Those keys start with Dagster's hidden
prefix ``.dagster/``: the filter matches them, the runs list does not show them (a 200-job batch
would otherwise print 200 tags on its row).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from recon_dagster.core.kinds import KINDS

if TYPE_CHECKING:  # the core stays Dagster-free; only the annotation names a Dagster run
    import dagster as dg

KIND_TAG = "recon/provider_kind"
PROVIDER_TAG = "recon/provider"
# The run queue's lane: "<provider>/small" or "<provider>/batch" (dagster.yaml limits batch runs).
LANE_TAG = "recon/provider_lane"
PARTITION_TAG = "dagster/partition"
# Visible on a reconcile run's row and filterable: what its end says about money and blame
# (provider_outage, internal_errors, refunded_at_cap, job_errors; recon_dagster.reconcile.verdict).
OUTCOME_TAG = "recon/outcome"
# Visible on an operator action's run: who acted (Dagster OSS has no users) and on which job.
OPERATOR_TAG = "recon/operator"
ACTION_JOB_TAG = "recon/job"
# The run key Dagster records on a sensor-requested run (``reconcile.batches.run_key_for``).
RUN_KEY_TAG = "dagster/run_key"
# Dagster leaves keys with this prefix out of every run's visible tags (TagType.HIDDEN).
HIDDEN = ".dagster/"
JOB_TAG_PREFIX = f"{HIDDEN}recon-job-"
JOB_TAG_VALUE = "1"
# The rest of what a reconcile run records about itself is hidden too: the runs list shows only
# what the run queue keys on (kind, provider, lane) and the partition, so a row stays one line.
# The Runs page's tag filter and RunsFilter still match hidden keys.
WORK_TAG = f"{HIDDEN}recon-work"  # the sensor's work key (the run key without its retry suffix)
LEGACY_WORK_TAG = "recon/work"  # runs requested before the work tag was hidden carry this one
JOB_COUNT_TAG = f"{HIDDEN}recon-count"  # not "recon-job-...": that prefix is a job id's
ATTEMPT_TAG = f"{HIDDEN}recon-attempt"  # the attempt(s) the run's jobs make, e.g. "4" or "1,2"
ROLE_TAG = f"{HIDDEN}recon-role"  # reconcile, sweep, plan, explain, operator
# Set on a reconcile run that rescheduled jobs whose polls its account's limiter never let out
# (their count): the run claimed them but left no attempt on them (the sensor's ``fresh_keys``).
NOT_SENT_TAG = f"{HIDDEN}recon-not-sent"
# Visible on a run that ended because its run worker went away (a code server restarted under it,
# its process killed): why, in a few words. Such a run is not the provider's or the data's failure
# (``recon_dagster.defs.alerts.interrupted``); ``fail_vanished_runs`` sets it on the runs it ends.
INTERRUPTED_TAG = "recon/interrupted"


def kind_tags(kind: str) -> dict[str, str]:
    """The tags of a run of ``kind``'s partition (the run queue's limits key on both)."""
    spec = KINDS.get(kind)
    return {KIND_TAG: kind, PROVIDER_TAG: str(spec.provider)} if spec else {KIND_TAG: kind}


def job_tag(job_id: uuid.UUID | str) -> tuple[str, str]:
    """The tag a run that worked ``job_id`` carries: the Runs page filter is ``key=value``."""
    return f"{JOB_TAG_PREFIX}{job_id}", JOB_TAG_VALUE


def job_tags(job_ids: list[uuid.UUID]) -> dict[str, str]:
    return dict(job_tag(j) for j in job_ids)


def tagged_job_ids(tags: dict[str, str]) -> set[str]:
    """The job ids a run's tags name (its per-job tags)."""
    return {k.removeprefix(JOB_TAG_PREFIX) for k in tags if k.startswith(JOB_TAG_PREFIX)}


def run_label(run: dg.DagsterRun) -> str:
    """What a reconcile or sweep run worked on, for alerts: its kind, else "sweep"."""
    kind = run.tags.get(KIND_TAG) or run.tags.get(PARTITION_TAG)
    if kind:
        return kind
    return "sweep" if run.job_name == "sync_sweep_job" else "all kinds"
