"""The reconcile sensor's own health: ``reconcile_sensor_ticking`` on ``inflight_backlog``.

``stale_inflight_jobs_sensor`` is what requests every reconcile run. When it errors on every tick
(a bad deployment, a code server that cannot load), skips every tick because the app's database is
unavailable, or stops ticking at all (a daemon that is down), no job is reconciled and no run
fails, so no other check or run turns red. This check reads the sensor's recent ticks from the
instance (the health schedule evaluates it every 5 minutes) and fails, with one line, while that
lasts; it passes again (and its incident resolves) with the first good tick.
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.scheduler.instigation import TickStatus

from recon_dagster.config import settings
from recon_dagster.core.text import short_reason
from recon_dagster.defs.observe.backlog import BACKLOG

SENSOR = "stale_inflight_jobs_sensor"
CHECK = "reconcile_sensor_ticking"
# Consecutive bad ticks before the check fails (one bad tick is a blip, not an outage).
BAD_TICKS = 3
# No tick for this many intervals: the daemon is not evaluating the sensor.
SILENT_INTERVALS = 10
_UNAVAILABLE = "database unavailable"


@dataclass(frozen=True)
class Tick:
    """What the judgement needs of one tick (Dagster's ``InstigatorTick``)."""

    status: TickStatus
    timestamp: float
    reason: str  # the error's first line, or the skip reason


def judge(ticks: Sequence[Tick], now: float, interval_s: float) -> tuple[bool, str]:
    """(passed, one line) from the sensor's ticks, newest first (pure)."""
    if not ticks:
        return True, f"{SENSOR} has not ticked yet"
    silent = now - ticks[0].timestamp
    if silent > SILENT_INTERVALS * interval_s:
        return False, (
            f"{SENSOR} has not ticked for {silent:.0f} s (every {interval_s:g} s expected): no job is "
            "reconciled; check that the daemon runs and the sensor is on"
        )
    recent = list(ticks[:BAD_TICKS])
    if len(recent) == BAD_TICKS and all(t.status is TickStatus.FAILURE for t in recent):
        return False, (
            f"{SENSOR} errored on its last {BAD_TICKS} ticks: no job is reconciled; last: "
            f"{short_reason(recent[0].reason, 240)}"
        )
    if len(recent) == BAD_TICKS and all(
        t.status is TickStatus.SKIPPED and t.reason.startswith(_UNAVAILABLE) for t in recent
    ):
        return False, (
            f"{SENSOR} skipped its last {BAD_TICKS} ticks, the app's database unavailable: no job is "
            f"reconciled; last: {short_reason(recent[0].reason, 240)}"
        )
    return True, f"{SENSOR} ticking: last tick {silent:.0f} s ago ({ticks[0].status.value.lower()})"


def sensor_ticks(instance: dg.DagsterInstance, limit: int = 10) -> list[Tick]:
    """The sensor's newest ticks in this instance, newest first (none when it never ticked)."""
    out: list[Tick] = []
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        if state.instigator_name != SENSOR:
            continue
        for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=limit):
            error = (
                tick.error.message.strip().splitlines()[0]
                if tick.error and tick.error.message.strip()
                else ""
            )
            out.append(Tick(tick.status, tick.timestamp, error or tick.skip_reason or ""))
    return sorted(out, key=lambda t: t.timestamp, reverse=True)[:limit]


@dg.asset_check(
    asset=BACKLOG,
    name=CHECK,
    description=f"{SENSOR}, which requests every reconcile run, is ticking: fails while it errors on "
    f"{BAD_TICKS} ticks in a row, skips {BAD_TICKS} in a row because the app's database is unavailable, "
    f"or has not ticked for {SILENT_INTERVALS} intervals.",
)
def reconcile_sensor_ticking(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    ticks = sensor_ticks(context.instance)
    passed, line = judge(ticks, time.time(), settings().sensor_interval_s)
    return dg.AssetCheckResult(
        passed=passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=line,
        metadata={"ticks_read": len(ticks), "last_status": ticks[0].status.value if ticks else "-"},
    )
