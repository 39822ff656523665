"""Telemetry in the Dagster processes (docs/operations.md#metrics-and-traces).

Two kinds of process, two ways a value reaches the platform:

- the long-lived process that evaluates the sensors (the code server, ``dagster dev``) serves the
  Prometheus endpoint and computes the **state** gauges from the database at each collection (jobs
  in flight and stale by kind and age, provider health, leaked credits): they need no run worker
  to have survived, and every replica reports the same truth, so the shipped alert rules use them;
- a run worker lives for one run: its **event** counters and spans (outcomes, credits, polls,
  provider answers, limiter waits) are pushed by OTLP when its run ends (``flush_run``; the SDK
  also pushes at process exit). A scrape could never see them: the process is gone by then.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import dagster as dg
import sqlalchemy as sa

from recon_dagster.core.kinds import KINDS
from recon_dagster.db.engine import get_engine
from recon_dagster.db.jobs import inflight_by_age
from recon_dagster.defs.observe.backlog import CREDIT_LEAK_SQL, LEAK_GRACE_MINUTES
from recon_dagster.operator.health import HealthPolicy, State, verdicts
from recon_dagster.telemetry import instruments, setup, tracing
from recon_dagster.telemetry.instruments import (
    AGE_BUCKETS,
    CREDITS_LEAKED,
    JOBS_INFLIGHT,
    JOBS_STALE,
    PROVIDER_DOWN,
    PROVIDER_POLLED,
    PROVIDER_UNANSWERED,
    SENSOR_TICK,
)

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("recon_dagster.telemetry")
# One reading of the database serves every gauge of one collection (and a scrape and an OTLP
# push close together): at most one set of queries per CACHE_S.
CACHE_S = 5.0


class _DatabaseReadings:
    """The state gauges' figures, read from the database at most once per ``CACHE_S``."""

    def __init__(self, engine: Callable[[], sa.Engine]) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._at = -1e9
        self._figures: dict[str, list[tuple[float, Mapping[str, str | None]]]] = {}

    def figures(self, name: str) -> list[tuple[float, Mapping[str, str | None]]]:
        with self._lock:
            if time.monotonic() - self._at > CACHE_S:
                self._figures = self._read()
                self._at = time.monotonic()
            return self._figures.get(name, [])

    def _read(self) -> dict[str, list[tuple[float, Mapping[str, str | None]]]]:
        out: dict[str, list[tuple[float, Mapping[str, str | None]]]] = {}
        bounds = [low for low, _ in AGE_BUCKETS[1:]]
        with self._engine().connect() as conn:
            rows = inflight_by_age(conn, bounds)
            leaked = conn.execute(sa.text(CREDIT_LEAK_SQL), {"grace": LEAK_GRACE_MINUTES}).all()
            judged = verdicts(conn, HealthPolicy.from_config())
        # Every kind and bucket, zeros included: a series that stops is not a series at zero.
        seen = {(r["provider_kind"], int(r["bucket"])): r for r in rows}
        for kind in sorted(set(KINDS) | {k for k, _ in seen}):
            for i, (_, age) in enumerate(AGE_BUCKETS):
                r = seen.get((kind, i), {})
                labels = {"kind": kind, "age": age}
                out.setdefault(JOBS_INFLIGHT.name, []).append((float(r.get("inflight", 0)), labels))
                out.setdefault(JOBS_STALE.name, []).append((float(r.get("stale", 0)), labels))
        out[CREDITS_LEAKED.name] = [(float(len(leaked)), {})]
        for v in judged:
            labels = {"provider": v.provider}
            out.setdefault(PROVIDER_POLLED.name, []).append((float(v.figures.jobs), labels))
            out.setdefault(PROVIDER_UNANSWERED.name, []).append((float(v.figures.unanswered), labels))
            out.setdefault(PROVIDER_DOWN.name, []).append((1.0 if v.state is State.DOWN else 0.0, labels))
        return out


def ensure_process_telemetry(engine: Callable[[], sa.Engine] = get_engine) -> None:
    """In the long-lived process: the SDK, the Prometheus endpoint and the state gauges, once."""
    setup.start("process")
    setup.serve_prometheus()
    meter = setup.meter()
    if meter is None or not setup.claim_gauges():
        return
    readings = _DatabaseReadings(engine)
    for metric in (
        JOBS_INFLIGHT,
        JOBS_STALE,
        CREDITS_LEAKED,
        PROVIDER_POLLED,
        PROVIDER_UNANSWERED,
        PROVIDER_DOWN,
    ):
        instruments.observe(meter, metric, _reader(readings, metric.name))


def _reader(readings: _DatabaseReadings, name: str) -> Callable[[], Iterable[Any]]:
    return lambda: readings.figures(name)


def timed_tick(sensor: str) -> Callable[[F], F]:
    """A sensor's evaluation, timed (``recon_sensor_tick_duration``); its first tick in a process
    starts that process's telemetry (the sensors run in the long-lived process)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            try:
                ensure_process_telemetry()
            except Exception:  # telemetry never stops a tick (a port taken, an exporter's error)
                log.exception("telemetry could not start in this process; the tick goes on without it")
            started = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                SENSOR_TICK.record(time.monotonic() - started, sensor=sensor)

        return timed  # type: ignore[return-value]

    return wrap


@contextmanager
def run_span(context: dg.OpExecutionContext, name: str) -> Iterator[None]:
    """An op of a run as a span of the run's trace (``tracing.run_context``); the per-job spans of
    the reconciler are its children."""
    setup.start("run")
    if not tracing.enabled():
        yield
        return
    parent = tracing.run_context(context.run.tags, context.run_id)
    attributes = {"dagster.run_id": context.run_id, "dagster.job": context.job_name}
    if context.has_partition_key:
        attributes["recon.provider_kind"] = context.partition_key
    with tracing.span(name, attributes, parent=parent):
        yield


def flush_run() -> None:
    """Push what this run worker recorded, now that its run's work is done."""
    setup.flush()


def requested_run_tags(run_key: str, provider_kind: str, jobs: int) -> dict[str, str]:
    """The ``traceparent`` tag of a run the sensor requests (its trace's root span); none while
    tracing is off."""
    return tracing.requested_run_tags(
        "reconcile run", {"recon.run_key": run_key, "recon.provider_kind": provider_kind, "recon.jobs": jobs}
    )
