"""Spans, and the trace context a reconcile run carries from the sensor into its run worker.

One reconcile run is one trace: the sensor starts a ``reconcile run`` span per run it requests and
writes its W3C ``traceparent`` into the run's tags (``TRACEPARENT_TAG``); the run's ops continue
that trace, with a span per job's poll and settle (``download`` inside it) and the provider request
as their child (HTTP semantic conventions). A run with no such tag (Launchpad, a backfill) gets a
trace id derived from its run id, so it is one trace too.

While tracing is off (``setup`` installed no tracer) ``span`` costs one attribute read.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from recon_dagster.core.runtags import HIDDEN

# The run tag carrying the W3C trace context (hidden on the Runs page, like the other bookkeeping).
TRACEPARENT_TAG = f"{HIDDEN}recon-traceparent"
TRACER_NAME = "recon_dagster"
SpanKind = trace.SpanKind  # for callers that mark a client span
_PROPAGATOR = TraceContextTextMapPropagator()
_tracer: list[trace.Tracer] = []  # the installed tracer (empty: tracing off)


def install(tracer: trace.Tracer) -> None:
    _tracer[:] = [tracer]


def uninstall() -> None:
    _tracer.clear()


def enabled() -> bool:
    return bool(_tracer)


@contextmanager
def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    parent: otel_context.Context | None = None,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
) -> Iterator[trace.Span | None]:
    """A span around the block (current within it), child of ``parent`` or of the current span;
    nothing while tracing is off. An exception leaving the block marks the span as an error."""
    if not _tracer:
        yield None
        return
    with _tracer[0].start_as_current_span(
        name, context=parent, kind=kind, attributes=dict(attributes or {})
    ) as current:
        yield current


def current_context() -> otel_context.Context | None:
    """The context to hand a worker thread (``span(..., parent=...)``); None while off."""
    return otel_context.get_current() if _tracer else None


def requested_run_tags(name: str, attributes: Mapping[str, Any]) -> dict[str, str]:
    """Start (and end) the root span of a run being requested and return its ``traceparent`` as
    the run's tag; nothing while tracing is off."""
    if not _tracer:
        return {}
    root = _tracer[0].start_span(name, context=otel_context.Context(), attributes=dict(attributes))
    root.end()
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(root))
    return {TRACEPARENT_TAG: carrier["traceparent"]} if "traceparent" in carrier else {}


def run_context(tags: Mapping[str, str], run_id: str) -> otel_context.Context:
    """The trace context a run's spans continue: its ``traceparent`` tag, else a remote parent
    whose trace id is the run id (a run requested without the tag is still one trace)."""
    parent = tags.get(TRACEPARENT_TAG)
    if parent:
        ctx = _PROPAGATOR.extract({"traceparent": parent})
        if trace.get_current_span(ctx).get_span_context().is_valid:
            return ctx
    try:
        trace_id = uuid.UUID(run_id).int
    except ValueError:
        trace_id = uuid.uuid5(uuid.NAMESPACE_URL, run_id).int
    span_id = (trace_id & 0xFFFFFFFFFFFFFFFF) or 1
    remote = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(remote))
