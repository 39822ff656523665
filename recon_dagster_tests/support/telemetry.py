"""Telemetry in a test: a loopback OTLP/HTTP receiver that decodes what the SDK pushes (with
OpenTelemetry's own protobuf classes), telemetry turned on for one test and off after it, and
Debian's Prometheus and Alertmanager on free loopback ports.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from recon_dagster.telemetry import setup


@dataclass(frozen=True)
class Point:
    metric: str
    attributes: dict[str, str]
    value: float


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...] = ()


def _attrs(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
    return out


@dataclass
class OtlpReceiver:
    """An OTLP/HTTP (protobuf) collector on loopback: ``/v1/metrics`` and ``/v1/traces``."""

    metric_requests: list[ExportMetricsServiceRequest] = field(default_factory=list)
    trace_requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    content_types: set[str] = field(default_factory=set)

    def points(self) -> list[Point]:
        out = []
        for req in self.metric_requests:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        data = getattr(m, m.WhichOneof("data"))
                        for p in data.data_points:
                            value = (
                                float(p.count)
                                if m.WhichOneof("data") == "histogram"
                                else float(getattr(p, p.WhichOneof("value")))
                            )
                            out.append(Point(m.name, _attrs(p.attributes), value))
        return out

    def total(self, metric: str, **labels: str) -> float:
        """The latest cumulative value of ``metric`` summed over the series matching ``labels``
        (each push carries the cumulative figure: the last push per series counts)."""
        latest: dict[tuple[tuple[str, str], ...], float] = {}
        for p in self.points():
            if p.metric == metric and all(p.attributes.get(k) == v for k, v in labels.items()):
                latest[tuple(sorted(p.attributes.items()))] = p.value
        return sum(latest.values())

    def spans(self) -> list[Span]:
        out = []
        for req in self.trace_requests:
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        out.append(
                            Span(
                                s.name,
                                s.trace_id.hex(),
                                s.span_id.hex(),
                                s.parent_span_id.hex(),
                                s.kind,
                                _attrs(s.attributes),
                                tuple((e.name, _attrs(e.attributes)) for e in s.events),
                            )
                        )
        return out


@contextmanager
def otlp_receiver() -> Iterator[tuple[OtlpReceiver, str]]:
    """The receiver and its base URL (``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
    received = OtlpReceiver()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            with lock:
                received.content_types.add(self.headers.get("content-type", ""))
                if self.path == "/v1/metrics":
                    received.metric_requests.append(ExportMetricsServiceRequest.FromString(body))
                    answer = ExportMetricsServiceResponse().SerializeToString()
                elif self.path == "/v1/traces":
                    received.trace_requests.append(ExportTraceServiceRequest.FromString(body))
                    answer = ExportTraceServiceResponse().SerializeToString()
                else:
                    self.send_error(404)
                    return
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def telemetry_on(monkeypatch: pytest.MonkeyPatch, **env: str) -> Iterator[None]:
    """``RECON_TELEMETRY=1`` (and ``env``) for one test; the SDK shut down (flushed) after it."""
    setup.shutdown()
    monkeypatch.setenv("RECON_TELEMETRY", "1")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    try:
        yield
    finally:
        setup.shutdown()


# --- Prometheus and Alertmanager ----------------------------------------------------------------

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def prometheus_missing() -> bool:
    return not all(Path(b).exists() for b in (PROMETHEUS, ALERTMANAGER, PROMTOOL))


def skip_unless_prometheus() -> pytest.MarkDecorator:
    """Skip without Debian's prometheus and alertmanager, except under CI=true (a failure there)."""
    return pytest.mark.skipif(
        prometheus_missing() and os.environ.get("CI") is None,
        reason="needs Debian's prometheus and prometheus-alertmanager (apt-get install; .ci/run installs them)",
    )


def free_port() -> int:
    """A TCP port on loopback nobody listens on right now (the servers take a port number)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def wait_ready(self, path: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.url} exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"{self.url}{path} not ready: {self.log.read_text()[-2000:]}")

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        return list(get_json(url)["data"]["result"])


def _start(cmd: list[str], folder: Path, name: str, port: int) -> Server:
    log = folder / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=folder)
    return Server(process, f"http://127.0.0.1:{port}", log)


@contextmanager
def prometheus_stack(scrape_port: int, rules: str) -> Iterator[tuple[Server, Server]]:
    """Alertmanager, then Prometheus scraping ``127.0.0.1:scrape_port`` every second, evaluating
    ``rules`` (a rules file's text) every second and sending its alerts to that Alertmanager."""
    folder = Path(tempfile.mkdtemp(prefix="recon-prometheus-"))
    am_port, prom_port = free_port(), free_port()
    (folder / "alertmanager.yml").write_text(
        "route:\n  receiver: nobody\n  group_wait: 0s\n  group_interval: 1s\nreceivers:\n  - name: nobody\n"
    )
    (folder / "rules.yaml").write_text(rules)
    (folder / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "rule_files:\n  - rules.yaml\n"
        f"alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{am_port}']\n"
        "scrape_configs:\n  - job_name: recon_dagster\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{scrape_port}']\n"
    )
    am = _start(
        [
            ALERTMANAGER, f"--config.file={folder / 'alertmanager.yml'}", f"--storage.path={folder / 'am'}",
            f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=",
        ],
        folder, "alertmanager", am_port,
    )  # fmt: skip
    prom = _start(
        [
            PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        folder, "prometheus", prom_port,
    )  # fmt: skip
    try:
        am.wait_ready("/-/ready")
        prom.wait_ready("/-/ready")
        yield prom, am
    finally:
        for s in (prom, am):
            s.process.terminate()
            try:
                s.process.wait(10)
            except subprocess.TimeoutExpired:
                s.process.kill()
        shutil.rmtree(folder, ignore_errors=True)
