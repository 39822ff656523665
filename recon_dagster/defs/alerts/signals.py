"""What the alert sensor reads from the Dagster instance, as ``Signal``s in the order they happened.

- **Check evaluations**: every asset check of this code location, through the event log's
  execution history per check (``event_log_storage.get_asset_check_execution_history``), newer
  than the last record id the sensor's cursor holds for that check. A failed ERROR check (WARN too
  with ``RECON_ALERT_MIN_SEVERITY=warn``) is failing; a passed one, or one skipped by a run that
  succeeded (an idle provider's health check), is passing; a check whose run is still going is
  read again next tick.
- **Failed runs**: ``RUN_FAILURE`` events (``fetch_run_status_changes``) after the cursor's storage
  id, of this location's jobs except the operator's own actions (their failure is shown to the
  person who launched them). A reconcile run that failed because its provider did not answer
  (``recon/outcome=provider_outage``) is evidence for that provider's health incident and never a
  page of its own: the run evaluated the provider's health check just before it failed, and that
  check (DOWN from ``RECON_HEALTH_MIN_JOBS`` distinct jobs) is the one provider-outage alert.
- **Runs whose worker went away** (a code server restarted under them, a worker killed; the
  ``interrupted`` module) are a deploy's, not a provider's: no signal, unless runs of the same job
  and provider have kept dying that way for ten minutes with none succeeding (a restart loop),
  which opens (once) the same incident a failing run does.
- **Recovery of failing runs**: an open run incident resolves once a later run of the same job
  (and provider) succeeds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from recon_dagster.alerting.incidents import Severity, Signal
from recon_dagster.core.runtags import KIND_TAG, OUTCOME_TAG, PROVIDER_TAG, ROLE_TAG
from recon_dagster.defs.alerts.check_records import RunReader, evaluated_by_its_run, partitions_of
from recon_dagster.defs.alerts.interrupted import interrupted_reason, loop_line, restart_loop
from recon_dagster.reconcile.verdict import PROVIDER_OUTAGE

HEALTH_ASSET = "provider_health"
# Jobs whose failures are shown to whoever launched them, never alerted.
QUIET_ROLES = frozenset({"operator", "explain", "plan"})
HISTORY_PER_TICK = 25
# Unread executions counted for the log line when a check had more than a tick reads.
UNREAD_COUNTED = 1000
RUNS_PER_TICK = 100
# The first tick reads failed runs of this long ago (older ones were someone else's to alert on).
FIRST_LOOK_BACK_S = 600.0


@dataclass(frozen=True)
class Read:
    """One tick's signals and the cursor positions after them."""

    signals: list[Signal]
    check_ids: dict[str, int]
    run_storage_id: int | None


def check_incident(key: dg.AssetCheckKey, partition: str | None = None) -> str:
    """``check:<asset>:<check>``, and ``[<partition>]`` for a partitioned asset's check: each
    partition is an incident of its own (yesterday's green never resolves a red day)."""
    base = f"check:{key.asset_key.to_user_string()}:{key.name}"
    return f"{base}[{partition}]" if partition else base


def runs_incident(job_name: str, provider: str | None) -> str:
    return f"runs:{job_name}:{provider}" if provider else f"runs:{job_name}"


def _link(base: str | None, path: str, text: str) -> tuple[tuple[str, str], ...]:
    return ((text, f"{base}{path}"),) if base else ()


def _simple(metadata: Mapping[str, Any], limit: int = 10) -> dict[str, Any]:
    """Metadata a person can read in one line per entry (numbers, short texts, small JSON)."""
    out: dict[str, Any] = {}
    for name, entry in metadata.items():
        value = getattr(entry, "value", entry)
        short_text = isinstance(value, str) and len(value) <= 300
        small_json = isinstance(value, list | dict) and len(str(value)) <= 400
        if isinstance(value, bool | int | float) or short_text or small_json:
            out[name] = value
        if len(out) >= limit:
            break
    return out


def _check_signal(
    record: Any,
    evaluation: Any,
    failing: bool,
    severity: Severity,
    ui_url: str | None,
    partition: str | None = None,
) -> Signal:
    key: dg.AssetCheckKey = record.key
    asset = key.asset_key.to_user_string()
    details = _simple(evaluation.metadata) if evaluation is not None else {}
    if partition:
        details = {"partition": partition, **details}
    of = f" of {partition}" if partition else ""
    description = (evaluation.description if evaluation is not None else None) or ""
    provider = key.name if asset == HEALTH_ASSET else None
    if evaluation is None:  # skipped by a run that did its work
        description = (
            f"{provider} idle: no job of it polled in the health window, nothing failing"
            if provider
            else f"{asset} check {key.name}{of} skipped by its run: nothing failing"
        )
    elif not description:
        shown = ", ".join(f"{k} {v}" for k, v in list(details.items())[:4])
        description = f"{asset} check {key.name}{of} {'failed' if failing else 'passed'}" + (
            f": {shown}" if shown else ""
        )
    title = (
        f"{key.name} is {'DEGRADED' if severity == 'warning' else 'DOWN'} (provider_health)"
        if provider and failing
        else f"{provider} (provider_health)"
        if provider
        else f"{asset} check {key.name}{of} failed"
    )
    path = "/assets/" + "/".join(key.asset_key.path) + "?view=checks"
    return Signal(
        key=check_incident(key, partition),
        failing=failing,
        title=title,
        summary=description,
        at=_when(record),
        severity=severity,
        provider=provider,
        details=details,
        # A check that says what is new (its "news" metadata) is told again while its incident is open.
        news=str(details["news"]) if failing and "news" in details else None,
        links=_link(ui_url, path, f"{asset} checks") + _link(ui_url, f"/runs/{record.run_id}", "run")
        if record.run_id
        else _link(ui_url, path, f"{asset} checks"),
    )


def _when(record: Any) -> float:
    """When an execution happened: its event's time (the record's own is cut to the second)."""
    event = record.event
    return float(event.timestamp) if event is not None else float(record.create_timestamp)


def read_checks(
    instance: dg.DagsterInstance,
    check_keys: Iterable[dg.AssetCheckKey],
    last_ids: Mapping[str, int],
    *,
    since: float | None,
    include_warn: bool,
    ui_url: str | None,
    notes: list[str] | None = None,
) -> tuple[list[Signal], dict[str, int]]:
    """Signals of every check evaluation newer than ``last_ids``; for a check without one, those
    since ``since`` (when the sensor first looked), or only its latest on that very first look.
    The verdict is the evaluation, never the plan (``check_records``); each names its partition.
    ``notes`` gets one line per check whose evaluations were more than a tick reads."""
    signals: list[Signal] = []
    ids = dict(last_ids)
    storage = instance.event_log_storage
    runs = RunReader(instance)
    for key in check_keys:
        name = key.to_user_string()
        last = ids.get(name)
        records = sorted(
            storage.get_asset_check_execution_history(key, limit=HISTORY_PER_TICK + 1), key=lambda r: r.id
        )
        if len(records) > HISTORY_PER_TICK:
            records = records[1:]
            if last is not None and records[0].id > last + 1 and notes is not None:
                skipped = _unread(storage, key, last, records[0].id)
                if skipped:
                    notes.append(
                        f"{name}: {skipped} evaluation(s) older than the latest {HISTORY_PER_TICK} "
                        "since the last tick were left unread"
                    )
        if last is None:
            records = records[-1:] if since is None else [r for r in records if _when(r) >= since]
        for record in (r for r in records if last is None or r.id > last):
            if evaluated_by_its_run(record, runs):
                ids[name] = record.id  # its evaluation's own row is the verdict
                continue
            if record.status is AssetCheckExecutionRecordStatus.PLANNED:
                run = instance.get_run_by_id(record.run_id) if record.run_id else None
                if run is not None and not run.is_finished:
                    break  # still running: read it again next tick
                ids[name] = record.id
                if run is None or run.status == dg.DagsterRunStatus.SUCCESS:
                    # Skipped by a run that did its work: nothing is failing (an idle provider).
                    signals.append(_check_signal(record, None, False, "info", ui_url, record.partition))
                continue  # a check that could not run: its run's failure is the alert
            ids[name] = record.id
            evaluation = record.evaluation
            failed = record.status is AssetCheckExecutionRecordStatus.FAILED
            warn = evaluation is not None and evaluation.severity == dg.AssetCheckSeverity.WARN
            failing = failed and (include_warn or not warn)
            for partition in partitions_of(record, runs):
                signals.append(
                    _check_signal(
                        record, evaluation, failing, "warning" if warn else "error", ui_url, partition
                    )
                )
    return signals, ids


def _unread(storage: Any, key: dg.AssetCheckKey, last: int, oldest_read: int) -> int:
    """How many executions of ``key`` lie between the cursor and the oldest one read (at most
    ``UNREAD_COUNTED``)."""
    older = storage.get_asset_check_execution_history(key, limit=UNREAD_COUNTED, cursor=oldest_read)
    return sum(1 for r in older if r.id > last)


def failure_reason(step_failures: Sequence[dg.DagsterEvent], fallback: str | None) -> str:
    """The one-line reason a run failed: its failing step's own description (a ``dg.Failure``'s),
    else the first line of the error, never Dagster's "Steps failed: [...]" or a stack trace."""
    for ev in step_failures:
        data = ev.step_failure_data
        if data is None:
            continue
        if data.user_failure_data is not None and data.user_failure_data.description:
            return data.user_failure_data.description.strip().splitlines()[0]
        if data.error is not None and data.error.message.strip():
            return data.error.message.strip().splitlines()[0]
    return (fallback or "run failed").strip().splitlines()[0]


def alerted_jobs(repository: Any) -> list[str]:
    """The jobs of this location whose failed runs alert (all but the operator's own actions)."""
    return sorted(job.name for job in repository.get_all_jobs() if job.tags.get(ROLE_TAG) not in QUIET_ROLES)


def read_failed_runs(
    instance: dg.DagsterInstance,
    job_names: Sequence[str],
    after_storage_id: int | None,
    *,
    now: float,
    ui_url: str | None,
) -> tuple[list[Signal], int | None]:
    """Signals of the runs that failed after ``after_storage_id`` (the first time: recently)."""
    records = instance.fetch_run_status_changes(
        dg.RunStatusChangeRecordsFilter(
            event_type=dg.DagsterEventType.RUN_FAILURE,
            after_storage_id=after_storage_id,
            after_timestamp=now - FIRST_LOOK_BACK_S if after_storage_id is None else None,
            # (no job_names: dagster-postgres refuses that selector; the job is checked below)
        ),
        limit=RUNS_PER_TICK,
        ascending=True,
    ).records
    signals: list[Signal] = []
    last = after_storage_id
    for record in records:
        last = record.storage_id
        entry = record.event_log_entry
        run = instance.get_run_by_id(entry.run_id)
        if run is None or run.job_name not in job_names:
            continue
        # A run whose worker went away (a deploy) pages only when such runs keep dying (``interrupted``).
        interrupted = interrupted_reason(instance, run)
        loop = restart_loop(instance, run, float(entry.timestamp)) if interrupted else None
        if interrupted and loop is None:
            continue
        steps = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
        reason = failure_reason([e.dagster_event for e in steps if e.dagster_event], entry.message)
        provider = run.tags.get(PROVIDER_TAG)
        outage = run.tags.get(OUTCOME_TAG) == PROVIDER_OUTAGE and provider
        label = run.tags.get(KIND_TAG) or provider
        if loop is not None:
            reason = loop_line(loop, float(entry.timestamp), interrupted, reason)
        signals.append(
            Signal(
                key=runs_incident(run.job_name, provider),
                failing=True,
                title=f"{provider} is not answering: reconcile runs fail"
                if outage
                else f"{run.job_name} runs "
                + ("keep dying before they finish" if loop is not None else "fail")
                + (f" ({label})" if label else ""),
                summary=f"{reason} (run {run.run_id[:8]})",
                at=float(entry.timestamp),
                provider=provider,
                details={
                    "job": run.job_name,
                    "run_id": run.run_id,
                    "label": label or "-",
                    OUTCOME_TAG: run.tags.get(OUTCOME_TAG, "-"),
                },
                links=_link(ui_url, f"/runs/{run.run_id}", "failed run"),
                parent=f"check:{HEALTH_ASSET}:{provider}" if outage else None,
                standalone=not outage,
            )
        )
    if last is None:
        newest = instance.fetch_run_status_changes(dg.DagsterEventType.RUN_FAILURE, limit=1, ascending=False)
        last = newest.records[0].storage_id if newest.records else 0
    return signals, last


def read_recoveries(
    instance: dg.DagsterInstance, open_incidents: Mapping[str, Mapping[str, Any]], *, ui_url: str | None
) -> list[Signal]:
    """A passing signal for every open run incident whose job (and provider) has since succeeded."""
    signals = []
    for key, incident in open_incidents.items():
        if not key.startswith("runs:"):
            continue
        _, job_name, *rest = key.split(":", 2)
        provider = rest[0] if rest else None
        since = datetime.fromtimestamp(float(incident.get("last", incident.get("since", 0))), UTC)
        runs = instance.get_runs(
            filters=dg.RunsFilter(
                job_name=job_name,
                statuses=[dg.DagsterRunStatus.SUCCESS],
                tags={PROVIDER_TAG: provider} if provider else {},
                updated_after=since,
            ),
            limit=1,
        )
        if runs:
            run = runs[0]
            record = instance.get_run_record_by_id(run.run_id)
            ended = record.end_time if record is not None and record.end_time else since.timestamp()
            signals.append(
                Signal(
                    key=key,
                    failing=False,
                    title=str(incident.get("title", key)),
                    summary=f"run {run.run_id[:8]} of {job_name}"
                    + (f" ({provider})" if provider else "")
                    + " succeeded",
                    at=float(ended),
                    provider=provider,
                    details={"run_id": run.run_id},
                    links=_link(ui_url, f"/runs/{run.run_id}", "run that succeeded"),
                )
            )
    return signals
