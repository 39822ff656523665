"""``fail_vanished_runs``: a run whose run worker is gone is failed, and its jobs given back.

Dagster's own launcher (``DefaultRunLauncher``, what ``dagster.yaml`` ships for a VM or compose)
starts each run as a child process of the code server. Restart that code server (a deploy, a
``systemctl restart`` whose stop timeout ends in SIGKILL, a reboot) while a run works, and the
worker dies with it, but nothing records the end: the code server that would have noticed is gone
too, and Dagster's run monitoring cannot ask this launcher about a worker's health. The run stays
STARTED forever, holding a slot of the run queue, and its jobs count as "in a running run", so the
stale-jobs sensor never requests them again.

This sensor asks the code server at the address the run was launched through (the run's
``GRPC_INFO_TAG``) whether it still executes the run (``CanCancelExecution``: the code server's own
table of its run processes). A code server that answers "not mine" for a run still STARTED has
been replaced since it launched it. That alone is not enough: ``dagster code-server start`` answers
for its current child only, and after a "Reload location" the previous child still works the runs
it started. So the run's worker process (the pid Dagster logged when it started it) must be gone
too, as this process (the code server, on the host its run workers run on) sees it: no process with
that pid started before the run did. Then the run is failed (Dagster's ``UNEXPECTED_TERMINATION``,
and ``recon/interrupted`` says why), and the leases it held are released at once, so its jobs are
retaken at the stale-jobs sensor's next tick with no attempt counted. An address that does not
answer is only judged once the run has logged nothing for ``SILENT_S`` (a code server restarting
answers within seconds; one that never answers again was moved).

It relies on one code server per address, as every recipe in ``deploy/`` has it. On Kubernetes the
K8s run launcher runs each worker as a Job that Dagster's run monitoring watches itself: this
sensor then does nothing.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import dagster as dg
from dagster._core.events import JobFailureData, RunFailureReason
from dagster._core.launcher import DefaultRunLauncher
from dagster._core.storage.tags import GRPC_INFO_TAG
from dagster._grpc.client import DagsterGrpcClient
from dagster._grpc.types import CanCancelExecutionRequest, CanCancelExecutionResult
from dagster._serdes import deserialize_value

from recon_dagster.core.runtags import INTERRUPTED_TAG
from recon_dagster.db import jobs as jobs_db
from recon_dagster.defs.reconcile.failed_runs import run_job_ids, run_lease_owner
from recon_dagster.defs.reconcile.jobs import reconcile_job
from recon_dagster.defs.resources import DatabaseResource, ReconcileSettingsResource

SENSOR_NAME = "fail_vanished_runs"
# A run this young is left alone: its worker may only just have registered with its code server.
GRACE_S = 30.0
# A code server that does not answer: the run is judged gone once it has logged nothing this long.
SILENT_S = 300.0
# One question to a code server; a restarting one refuses connections at once.
ASK_TIMEOUT_S = 10
WORKER_GONE = "worker_gone"


@dataclass(frozen=True)
class Verdict:
    """What the code server that launched a run says of it: ``gone`` (with why) or not."""

    gone: bool
    why: str


def _address(run: dg.DagsterRun) -> dict[str, object] | None:
    raw = run.tags.get(GRPC_INFO_TAG)
    if not raw:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def _where(info: dict[str, object]) -> str:
    return f"{info.get('host')}:{info.get('port')}" if info.get("port") else f"socket {info.get('socket')}"


def ask_code_server(run: dg.DagsterRun, last_event_at: float, now: float) -> Verdict:
    """Whether the code server ``run`` was launched through still executes it (pure but for the
    one gRPC question)."""
    info = _address(run)
    if info is None:
        return Verdict(False, "launched without a code server address")
    where = _where(info)
    client = DagsterGrpcClient(
        port=int(str(info["port"])) if info.get("port") else None,
        socket=str(info["socket"]) if info.get("socket") else None,
        host=str(info.get("host") or "localhost"),
        use_ssl=bool(info.get("use_ssl", False)),
    )
    try:
        raw = client.can_cancel_execution(CanCancelExecutionRequest(run_id=run.run_id), timeout=ASK_TIMEOUT_S)
        answer = deserialize_value(raw, CanCancelExecutionResult)
    except Exception as exc:  # unreachable, restarting, or not a code server at all
        silent = now - last_event_at
        if silent < SILENT_S:
            return Verdict(False, f"the code server at {where} did not answer ({type(exc).__name__})")
        return Verdict(
            True,
            f"the code server at {where} that started it has not answered and the run has logged "
            f"nothing for {silent:.0f} s",
        )
    if answer.can_cancel:
        return Verdict(False, f"the code server at {where} still runs it")
    return Verdict(
        True,
        f"the code server at {where} no longer runs it: it was restarted or replaced since it started "
        "the run, and the run worker went with it",
    )


# What Dagster's run worker logs first: "Started process for run (pid: 1234)."
_STARTED_PROCESS = re.compile(r"Started process for run \(pid: (\d+)\)\.")


def worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid of ``run_id``'s run worker, as Dagster logged it when the worker started."""
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        found = _STARTED_PROCESS.fullmatch(entry.message or "")
        if found:
            return int(found.group(1))
    return None


def worker_alive(pid: int | None, started: float) -> bool:
    """Whether a process with ``pid`` that began before the run (``started``) still lives here; a
    pid reused by a later process, or a zombie, is not the worker. Read from ``/proc`` (the
    runtime does not ship psutil); where there is none, a process with that pid counts as alive."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a process is there that we may not signal: never fail a run on a guess
    born = _proc_start(pid)
    if born is None:
        return True
    state, at = born
    return state != "Z" and at <= started + 1.0


def _proc_start(pid: int) -> tuple[str, float] | None:
    """(state, start time in epoch seconds) of ``pid`` from ``/proc``; None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may hold spaces and parentheses: fields after its last ")".
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    # After the name: state is field 3, starttime (clock ticks since boot) field 22.
    return fields[0], boot + int(fields[19]) / ticks


def _last_event_at(instance: dg.DagsterInstance, run_id: str, fallback: float) -> float:
    records = instance.get_records_for_run(run_id, limit=1, ascending=False).records
    return float(records[0].event_log_entry.timestamp) if records else fallback


def fail_vanished(
    instance: dg.DagsterInstance,
    database: DatabaseResource,
    lease_seconds: float,
    *,
    now: float | None = None,
) -> list[str]:
    """Fail every STARTED run of this instance whose worker is gone; one line per run ended."""
    if not isinstance(instance.run_launcher, DefaultRunLauncher):
        return []  # another launcher's workers are watched by Dagster's own run monitoring
    now = time.time() if now is None else now
    lines: list[str] = []
    for record in instance.get_run_records(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
        run = record.dagster_run
        started = record.start_time or record.create_timestamp.timestamp()
        if now - started < GRACE_S:
            continue
        verdict = ask_code_server(run, _last_event_at(instance, run.run_id, started), now)
        if not verdict.gone or worker_alive(worker_pid(instance, run.run_id), started):
            continue
        # Asked again after the answer: a run that ended meanwhile (its worker finished) is left be.
        current = instance.get_run_by_id(run.run_id)
        if current is None or current.status is not dg.DagsterRunStatus.STARTED:
            continue
        message = f"run worker gone: {verdict.why}; failed by {SENSOR_NAME}"
        instance.add_run_tags(run.run_id, {INTERRUPTED_TAG: WORKER_GONE})
        instance.report_engine_event(message, current)
        instance.report_run_failed(
            current,
            message,
            JobFailureData(error=None, failure_reason=RunFailureReason.UNEXPECTED_TERMINATION),
        )
        released = (
            _release(current, database, lease_seconds, now) if run.job_name == reconcile_job.name else []
        )
        lines.append(
            f"run {run.run_id} ({run.job_name}) failed: {message}"
            + (
                f"; released the leases of {len(released)} job(s), retaken at the next tick"
                if released
                else ""
            )
        )
    return lines


def _release(
    run: dg.DagsterRun, database: DatabaseResource, lease_seconds: float, now: float
) -> list[object]:
    # As release_failed_run_leases does (it would, on its next tick): a lease renewed after now
    # is a re-execution's under the same run key, kept.
    by = datetime.fromtimestamp(now, UTC) + timedelta(seconds=lease_seconds + 5)
    with database.get_engine().begin() as conn:
        return list(jobs_db.release_leases_of(conn, run_lease_owner(run), run_job_ids(run), expiring_by=by))


@dg.sensor(
    name=SENSOR_NAME,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Fails a STARTED run whose run worker is gone (the code server that launched it was "
    "restarted or replaced, so it no longer runs it) and releases the leases a reconcile run held, "
    "so its jobs are retaken at the next tick with no attempt counted. Such a run pages only when "
    "runs keep dying (reconcile_alerts).",
)
def fail_vanished_runs(
    context: dg.SensorEvaluationContext,
    database: DatabaseResource,
    reconcile_settings: ReconcileSettingsResource,
) -> dg.SkipReason:
    lines = fail_vanished(context.instance, database, reconcile_settings.lease_seconds)
    for line in lines:
        context.log.warning(line)
    return dg.SkipReason("; ".join(lines) if lines else "no run whose worker is gone")
