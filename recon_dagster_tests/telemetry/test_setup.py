"""Telemetry on and off: off, nothing is installed and every instrument is a no-op; on, a taken
Prometheus port is one logged error (the sensor's tick goes on), and OTLP is pushed only where the
standard variables name a collector."""

from __future__ import annotations

import logging
import socket

import pytest

from recon_dagster.telemetry import instruments, setup, tracing
from recon_dagster.telemetry.sdk import otlp_endpoint
from recon_dagster_tests.support.telemetry import telemetry_on


def test_off_by_default_nothing_is_installed_and_recording_is_a_no_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup.shutdown()
    monkeypatch.delenv("RECON_TELEMETRY", raising=False)
    assert setup.start() is None and setup.serve_prometheus() is None
    assert not instruments.enabled() and not tracing.enabled()
    instruments.OUTCOMES.add(1, kind="kie-standard", outcome="error")  # nothing to record into
    with tracing.span("poll") as current:
        assert current is None
    assert tracing.requested_run_tags("reconcile run", {}) == {}


def test_a_taken_prometheus_port_is_one_logged_error_not_a_failed_tick(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with telemetry_on(monkeypatch, RECON_METRICS_PORT=str(port)), caplog.at_level(logging.ERROR):
            assert setup.serve_prometheus() is None
            assert setup.serve_prometheus() is None  # tried once per process
            assert "Prometheus endpoint not served" in caplog.text and "RECON_METRICS_PORT" in caplog.text
            assert instruments.enabled()  # the rest of telemetry is on


def test_otlp_is_pushed_only_where_a_collector_is_named() -> None:
    assert otlp_endpoint("metrics", {}) is None  # never OpenTelemetry's default localhost:4318
    assert otlp_endpoint("traces", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == "http://c:4318"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_METRICS_EXPORTER": "none"}
    assert otlp_endpoint("metrics", env) is None and otlp_endpoint("traces", env) == "http://c:4318"
    assert (
        otlp_endpoint("metrics", {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m/v1/metrics"})
        == "http://m/v1/metrics"
    )
