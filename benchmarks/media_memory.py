"""Memory and throughput of moving one large media object through open_media_stream into a store.

    .venv/bin/python benchmarks/media_memory.py              # 1 GiB, local folder and moto S3
    .venv/bin/python benchmarks/media_memory.py --size-mb 64 # quick run

Processes: this orchestrator starts (1) a loopback HTTP server that generates the object on the
fly and (2) a moto S3 server, each in its own process so their memory is not counted, then runs
every case in a fresh child process (the measured "benchmark process") so each case's peak RSS
is its own. Each child prints: bytes moved, seconds, MB/s, RSS after imports, peak RSS
(``ru_maxrss``), the growth between the two, and the tracemalloc peak of the transfer.
The budget checked is 100 MB for what the transfer itself adds (RSS growth and tracemalloc peak);
the absolute RSS is printed too -- importing dagster and dagster_aws alone is about 110-130 MB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MIB = 1024 * 1024
BUDGET_MB = 100
BUCKET = "recon-media-bench"
_BLOCK = hashlib.sha256(b"recon").digest() * (MIB // 32)  # 1 MiB, not all one byte


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout_s}s")


def _rss_mb() -> float:
    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _expected_sha256(size: int) -> str:
    digest = hashlib.sha256()
    remaining = size
    while remaining:
        take = min(remaining, len(_BLOCK))
        digest.update(_BLOCK[:take])
        remaining -= take
    return digest.hexdigest()


# --- the generator server (its own process) -----------------------------------------------------


class _Generator(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:  # noqa: N802
        size = int(self.path.rsplit("=", 1)[1])
        self.send_response(200)
        self.send_header("Content-Type", "video/mp4")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        remaining = size
        try:
            while remaining:
                take = min(remaining, len(_BLOCK))
                self.wfile.write(_BLOCK[:take])
                remaining -= take
        except (BrokenPipeError, ConnectionResetError):
            pass


def serve(port: int) -> None:
    ThreadingHTTPServer(("127.0.0.1", port), _Generator).serve_forever()


# --- one measured case (its own process) ---------------------------------------------------------


def run_case(case: str, url: str, endpoint: str, workdir: str, part_size_mb: int, trace: bool) -> dict:
    import tracemalloc

    from dagster_aws.s3 import S3Resource

    from recon_dagster.media.store import LocalMediaStore, S3MediaStore
    from recon_dagster.media.transfer import fetch_to_store

    if case == "local":
        store: LocalMediaStore | S3MediaStore = LocalMediaStore(base_dir=workdir)
    else:
        store = S3MediaStore(
            s3=S3Resource(
                endpoint_url=endpoint,
                aws_access_key_id="bench",
                aws_secret_access_key="bench",
                region_name="us-east-1",
            ),
            bucket=BUCKET,
            part_size=part_size_mb * MIB,
        )
        store._get_client()  # build the client before the baseline, like a warm worker
    allowed = {url.split("/")[2]}
    baseline = _rss_mb()
    if trace:
        tracemalloc.start()
    cpu_before = _cpu_s()
    started = time.perf_counter()
    stored = fetch_to_store(url, store, "videos/bench/0.mp4", max_bytes=1 << 40, allowed_hosts=allowed)
    seconds = time.perf_counter() - started
    cpu = _cpu_s() - cpu_before
    traced_peak = tracemalloc.get_traced_memory()[1] / MIB if trace else None
    if trace:
        tracemalloc.stop()
    peak = _rss_mb()
    store.delete("videos/bench/0.mp4")
    return {
        "case": case,
        "bytes": stored.size,
        "sha256": stored.sha256,
        "seconds": seconds,
        "mb_per_s": stored.size / MIB / seconds,
        "cpu_s": cpu,
        "rss_after_imports_mb": baseline,
        "peak_rss_mb": peak,
        "rss_growth_mb": peak - baseline,
        "tracemalloc_peak_mb": traced_peak,
    }


# --- orchestration -------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mb", type=int, default=1024, help="object size in MiB (default 1024)")
    parser.add_argument("--cases", default="local,s3", help="comma-separated: local, s3")
    parser.add_argument("--part-size-mb", type=int, default=8, help="S3 multipart part size in MiB")
    parser.add_argument("--no-tracemalloc", action="store_true", help="skip tracemalloc (it slows the copy)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run-case", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.serve:
        serve(args.serve)
        return 0
    if args.run_case:
        result = run_case(
            args.run_case, args.url, args.endpoint, args.workdir, args.part_size_mb, not args.no_tracemalloc
        )
        print(json.dumps(result))
        return 0

    size = args.size_mb * MIB
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    gen_port, moto_port = _free_port(), _free_port()
    workdir = tempfile.mkdtemp(prefix="recon-media-bench-")
    children: list[subprocess.Popen] = []
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    failures = 0
    try:
        children.append(subprocess.Popen([sys.executable, __file__, "--serve", str(gen_port)], **quiet))
        if "s3" in cases:
            moto = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)]
            children.append(subprocess.Popen(moto, **quiet))
            _wait_for_port(moto_port)
            import boto3

            boto3.client(
                "s3",
                endpoint_url=f"http://127.0.0.1:{moto_port}",
                aws_access_key_id="bench",
                aws_secret_access_key="bench",
                region_name="us-east-1",
            ).create_bucket(Bucket=BUCKET)
        _wait_for_port(gen_port)
        expected = _expected_sha256(size)
        url = f"http://127.0.0.1:{gen_port}/media?size={size}"
        print(f"object: {size} bytes ({args.size_mb} MiB), S3 part size {args.part_size_mb} MiB")
        header = f"{'case':6} {'bytes':>12} {'s':>7} {'MB/s':>8} {'cpu s':>6} {'RSS0 MB':>8} {'peakRSS':>8} {'growth':>7} {'tracemalloc':>11}"
        print(header)
        for case in cases:
            command = [
                sys.executable,
                __file__,
                "--run-case",
                case,
                "--url",
                url,
                "--endpoint",
                f"http://127.0.0.1:{moto_port}",
                "--workdir",
                workdir,
                "--part-size-mb",
                str(args.part_size_mb),
            ]
            if args.no_tracemalloc:
                command.append("--no-tracemalloc")
            answer = subprocess.run(command, capture_output=True, text=True, check=False)
            if answer.returncode != 0:
                print(f"{case}: FAILED\n{answer.stderr[-3000:]}")
                failures += 1
                continue
            r = json.loads(answer.stdout.strip().splitlines()[-1])
            traced = f"{r['tracemalloc_peak_mb']:.1f}" if r["tracemalloc_peak_mb"] is not None else "-"
            print(
                f"{case:6} {r['bytes']:>12} {r['seconds']:>7.2f} {r['mb_per_s']:>8.1f} {r['cpu_s']:>6.2f} "
                f"{r['rss_after_imports_mb']:>8.1f} {r['peak_rss_mb']:>8.1f} {r['rss_growth_mb']:>7.1f} {traced:>11}"
            )
            ok = r["bytes"] == size and r["sha256"] == expected
            within = r["rss_growth_mb"] < BUDGET_MB and (
                r["tracemalloc_peak_mb"] is None or r["tracemalloc_peak_mb"] < BUDGET_MB
            )
            print(
                f"       content {'verified' if ok else 'MISMATCH'}; transfer memory "
                f"{'within' if within else 'OVER'} the {BUDGET_MB} MB budget"
            )
            failures += (not ok) + (not within)
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
