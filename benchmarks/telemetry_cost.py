"""CPU of telemetry's per-job calls in a run worker, off and on (docs/benchmarks.md#telemetry).

What one reconciled job records: an outcome, a poll sent, a provider answer, a limiter wait, the
committed credits (count and amount) and four spans (settle, poll, its HTTP request, download),
telemetry off, then on (the SDK, OTLP/HTTP to a loopback sink in this process, pushed at the end
as a run worker does). ``OTEL_TRACES_EXPORTER=none`` measures the metrics alone.

    python benchmarks/telemetry_cost.py [JOBS]
"""

from __future__ import annotations

import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from recon_dagster.telemetry import instruments as m
from recon_dagster.telemetry import setup
from recon_dagster.telemetry.tracing import SpanKind, span

KIND = "replicate-prediction"


class Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def one_job(i: int) -> None:
    job = {"recon.job_id": str(i), "recon.provider_kind": KIND, "recon.attempt": 1}
    request = {"http.request.method": "GET", "url.full": "http://127.0.0.1/v1/predictions/x"}
    with span("settle", job):
        with span("poll", job), span("GET", request, kind=SpanKind.CLIENT):
            m.LIMITER_WAIT.record(0.001, provider="replicate")
            m.PROVIDER_ANSWERS.add(1, provider="replicate", **{"class": "2xx"})
            m.POLLS_SENT.add(1, kind=KIND)
        with span("download", job):
            pass
        m.CREDITS_COMMITTED.add(1, kind=KIND)
        m.CREDITS_COMMITTED_AMOUNT.add(30, kind=KIND)
        m.OUTCOMES.add(1, kind=KIND, outcome="recovered")


def measure(jobs: int) -> float:
    """CPU microseconds per job, the push at the end included."""
    started = time.process_time()
    for i in range(jobs):
        one_job(i)
    setup.flush()
    return (time.process_time() - started) / jobs * 1e6


def main() -> int:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    off = measure(jobs)
    os.environ["RECON_TELEMETRY"] = "1"
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{sink.server_address[1]}"
    setup.start("benchmark")
    measure(2_000)  # warm up
    on = measure(jobs)
    setup.shutdown()
    traces = os.environ.get("OTEL_TRACES_EXPORTER", "otlp") != "none"
    print(
        f"{jobs:,} jobs: telemetry off {off:.1f} us CPU/job, on {on:.1f} us CPU/job "
        f"({'metrics and spans' if traces else 'metrics only'}, OTLP push included)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
