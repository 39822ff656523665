"""OpenTelemetry's SDK, built from the settings (the ``telemetry`` extra; imported only when
``RECON_TELEMETRY`` is on).

Exporters: OTLP/HTTP (protobuf) when the standard ``OTEL_EXPORTER_OTLP_*ENDPOINT`` variables name a
collector (the exporters read them, and ``OTEL_EXPORTER_OTLP_HEADERS``, themselves), and a
Prometheus reader when ``RECON_METRICS_PORT`` is set. The reader only answers scrapes; the HTTP
endpoint is started by the long-lived process alone (``setup.serve_prometheus``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

SERVICE = "recon_dagster"


def otlp_endpoint(signal: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The collector a signal (``metrics``, ``traces``) is pushed to, as the OTLP exporter will
    read it; None: not pushed (OpenTelemetry's default, localhost:4318, is never assumed)."""
    env = os.environ if environ is None else environ
    if env.get(f"OTEL_{signal.upper()}_EXPORTER", "otlp").strip().lower() == "none":
        return None
    return (
        env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or None
    )


@dataclass
class Sdk:
    meters: MeterProvider
    tracers: TracerProvider | None
    prometheus: PrometheusMetricReader | None
    readers: list[MetricReader] = field(default_factory=list)

    def force_flush(self, timeout_ms: int = 10_000) -> None:
        """Push what this process recorded now (a run worker, at its run's end)."""
        self.meters.force_flush(timeout_ms)
        if self.tracers is not None:
            self.tracers.force_flush(timeout_ms)

    def shutdown(self) -> None:
        self.meters.shutdown()
        if self.tracers is not None:
            self.tracers.shutdown()


def build(*, role: str, prometheus: bool, resource_attributes: Mapping[str, Any] | None = None) -> Sdk:
    """The providers of one process: ``role`` names it in the resource (``process``, ``run``)."""
    resource = Resource.create(
        {
            "service.name": os.environ.get("OTEL_SERVICE_NAME") or SERVICE,
            "recon.role": role,
            **(resource_attributes or {}),
        }
    )
    readers: list[MetricReader] = []
    reader = PrometheusMetricReader() if prometheus else None
    if reader is not None:
        readers.append(reader)
    if otlp_endpoint("metrics"):
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    # shutdown_on_exit: the SDK pushes what is left when the process exits, run workers included.
    meters = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=True)
    tracers = None
    if otlp_endpoint("traces"):
        tracers = TracerProvider(resource=resource, shutdown_on_exit=True)
        tracers.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return Sdk(meters, tracers, reader, readers)
