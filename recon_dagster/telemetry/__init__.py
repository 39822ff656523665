"""Metrics and traces through OpenTelemetry (docs/operations.md#metrics-and-traces).

``instruments`` declares every metric once (name, type, unit, labels, meaning) and records through
OpenTelemetry's API only: until ``setup`` installs the SDK (``RECON_TELEMETRY=1``, the ``telemetry``
extra) every call returns at its first line. ``tracing`` holds the spans and the run's trace
context. ``setup`` reads the settings and builds the SDK (``sdk``); ``gauges`` computes the
database-derived gauges in the long-lived process.

A layer between the database and the core: the domain, the adapters and the database record here,
and nothing here imports them (the database-derived gauges are handed their queries).
"""
