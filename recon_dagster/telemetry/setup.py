"""Telemetry on or off for this process, from the settings (``RECON_TELEMETRY``, ``RECON_METRICS_*``).

``start`` builds the SDK once per process and hands its meter and tracer to ``instruments`` and
``tracing``. Who calls it decides the role: a run worker's ops (``run``: push by OTLP at the run's
end, ``flush``), the long-lived process that evaluates the sensors (``process``: it also serves the
Prometheus endpoint, ``serve_prometheus``, and computes the database-derived gauges).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from recon_dagster.config import Settings, settings
from recon_dagster.telemetry import instruments, tracing

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

    from recon_dagster.telemetry.sdk import Sdk

log = logging.getLogger("recon_dagster.telemetry")
_lock = threading.Lock()
_state: dict[str, Any] = {}  # "sdk", "server", "port", "gauges"


def start(role: str = "process") -> Sdk | None:
    """Install the SDK in this process if ``RECON_TELEMETRY`` is on (idempotent); None while off."""
    if not settings().telemetry:
        return None
    with _lock:
        sdk: Sdk | None = _state.get("sdk")
        if sdk is not None:
            return sdk
        try:
            from recon_dagster.telemetry import sdk as sdk_module
        except ImportError as exc:
            raise RuntimeError(
                f"{Settings.telemetry.name} is on but OpenTelemetry's SDK is not installed ({exc}); "
                "install recon_dagster[telemetry]"
            ) from None
        sdk = sdk_module.build(role=role, prometheus=settings().metrics_port is not None)
        instruments.install(sdk.meters.get_meter(tracing.TRACER_NAME))
        instruments.install_commit_hooks()
        if sdk.tracers is not None:
            tracing.install(sdk.tracers.get_tracer(tracing.TRACER_NAME))
        _state["sdk"] = sdk
        return sdk


def meter() -> Meter | None:
    sdk: Sdk | None = _state.get("sdk")
    return sdk.meters.get_meter(tracing.TRACER_NAME) if sdk is not None else None


def serve_prometheus() -> int | None:
    """Serve ``/metrics`` on ``RECON_METRICS_HOST:RECON_METRICS_PORT`` once per process; returns
    the port listened on (None: no endpoint configured, or telemetry off)."""
    sdk = start("process")
    port = settings().metrics_port
    if sdk is None or sdk.prometheus is None or port is None:
        return None
    with _lock:
        if "port" in _state:  # served already, or tried and refused: once per process
            return _state["port"] and int(_state["port"])
        from prometheus_client import start_http_server

        try:
            server, _thread = start_http_server(port, addr=settings().metrics_host)
        except OSError as exc:  # the port is taken (another process of this host serves it)
            _state["port"] = None
            log.error(
                "Prometheus endpoint not served: %s:%s: %s (%s)",
                settings().metrics_host, port, exc, Settings.metrics_port.name,
            )  # fmt: skip
            return None
        _state["server"] = server
        _state["port"] = server.server_port
        log.info("Prometheus metrics on http://%s:%d/metrics", settings().metrics_host, server.server_port)
        return int(server.server_port)


def claim_gauges() -> bool:
    """True once per process: the caller registers the database-derived gauges."""
    with _lock:
        if _state.get("gauges") or "sdk" not in _state:
            return False
        _state["gauges"] = True
        return True


def flush() -> None:
    """Push what this process recorded (a run worker at its run's end); never raises."""
    sdk: Sdk | None = _state.get("sdk")
    if sdk is None:
        return
    try:
        sdk.force_flush()
    except Exception:  # telemetry never fails a run
        log.exception("could not push telemetry")


def shutdown() -> None:
    """Telemetry off in this process (tests): exporters flushed and closed, endpoint stopped."""
    with _lock:
        instruments.uninstall()
        tracing.uninstall()
        sdk: Sdk | None = _state.pop("sdk", None)
        server = _state.pop("server", None)
        _state.clear()
    if server is not None:
        server.shutdown()
        server.server_close()
    if sdk is not None:
        sdk.shutdown()


def prometheus_port() -> int | None:
    """The port ``serve_prometheus`` listens on in this process (None: not serving)."""
    port = _state.get("port")
    return int(port) if port is not None else None
