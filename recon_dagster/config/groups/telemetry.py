"""Metrics and traces (docs/operations.md#metrics-and-traces); OpenTelemetry's own ``OTEL_*``
variables are only named, in ``recon_dagster.config``'s others: its SDK reads them.

A group of ``recon_dagster.config.Settings`` (it inherits this class): see that package."""

from __future__ import annotations

from recon_dagster.config.parse import knob, lenient_flag, text
from recon_dagster.config.var import setting


class TelemetryGroup:
    __slots__ = ()

    # fmt: off
    # telemetry
    telemetry = setting(
        "telemetry", "flag", False,
        "`1`: metrics and traces through OpenTelemetry's SDK (the `telemetry` extra): OTLP/HTTP to the "
        "standard `OTEL_*` endpoint when one is set, and the Prometheus endpoint below when its port is "
        "([operations.md](operations.md#metrics-and-traces)). Unset: every instrument is a no-op.",
        parse=lenient_flag, bounds="`1`/`true`/`yes` = on", shown_default="off",
    )
    metrics_port = setting(
        "telemetry", "port", None,
        "With `RECON_TELEMETRY`: the long-lived process (the code server that evaluates the sensors, or "
        "`dagster dev`) serves Prometheus' `/metrics` on this port (`0`: a free one, logged). Run workers "
        "never serve it: they push by OTLP at run end.",
        parse=knob(int, 0, 65535), bounds="0-65535", shown_default="— (no endpoint)",
    )
    metrics_host = setting(
        "telemetry", "host", "127.0.0.1",
        "Address the Prometheus endpoint listens on (`0.0.0.0` for a scrape from another host or pod).",
        parse=text,
    )
    # fmt: on
