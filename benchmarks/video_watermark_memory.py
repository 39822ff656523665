"""Memory and time of storing one large video of a watermark row: download -> spool -> re-encode.

    .venv/bin/python benchmarks/video_watermark_memory.py                  # ~256 MiB, 1280x720
    .venv/bin/python benchmarks/video_watermark_memory.py --size-mb 1024   # ~1 GiB
    .venv/bin/python benchmarks/video_watermark_memory.py --width 1920 --height 1080

The orchestrator makes a real MJPEG video of noise frames (incompressible, so the file is large
for its frame count) with PyAV, serves it from a loopback HTTP server in its own process, and
runs the production call -- ``transfer.fetch_media_to_store`` with a watermark text, into the
plain ``FolderWriter`` -- in a fresh child process. The child reports the peak RSS of the whole
process (``VmHWM``), its RSS after imports, the tracemalloc peak, seconds and CPU seconds; the
stored object is decoded afterwards to check it is a video with the same frame count.

The budget applies to the child's peak RSS: the video is spooled to a temporary file and
re-encoded file to file, so the peak must not grow with the size. It is ``media_memory.py``'s
100 MB plus 50 MB for what re-encoding needs at 720p and no plain move does: FFmpeg's libraries
(~23 MB once imported), decoder and x264 frame buffers, one RGB frame for the band.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.media_memory import MIB, _cpu_s, _free_port, _memory_mb, _wait_for_port

KEY = "videos/bench/0.mp4"
BUDGET_MB = 150


def make_video(path: str, size_mb: int, width: int, height: int) -> int:
    """Write an MJPEG/AVI video of noise frames, about ``size_mb`` MiB; returns its frame count."""
    import av
    from PIL import Image

    frames = written = 0
    with av.open(path, "w", format="avi") as out:
        stream = out.add_stream("mjpeg", rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuvj420p"
        stream.options = {"q:v": "2"}
        while written < size_mb * MIB:
            noise = Image.frombytes("RGB", (width, height), os.urandom(width * height * 3))
            frame = av.VideoFrame.from_image(noise).reformat(format="yuvj420p")
            frame.pts, frame.time_base = frames, Fraction(1, 25)
            packets = stream.encode(frame)
            written += sum(p.size for p in packets)
            out.mux(packets)
            frames += 1
        out.mux(stream.encode(None))
    return frames


def serve(port: int, path: str) -> None:
    """Answer every GET with the file at ``path`` (video/x-msvideo), streamed in 1 MiB reads."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Files(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "video/x-msvideo")
            self.send_header("Content-Length", str(os.path.getsize(path)))
            self.end_headers()
            with open(path, "rb") as f:
                while chunk := f.read(MIB):
                    self.wfile.write(chunk)

    ThreadingHTTPServer(("127.0.0.1", port), Files).serve_forever()


def run_case(url: str, workdir: str, trace: bool) -> dict:
    """Store the video watermarked in this process and return the figures (a fresh child)."""
    import tracemalloc

    from recon_dagster.media.folder import FolderWriter
    from recon_dagster.media.transfer import fetch_media_to_store

    store = FolderWriter(workdir)
    rss_after_imports, _ = _memory_mb()
    if trace:
        tracemalloc.start()
    cpu_before, started = _cpu_s(), time.perf_counter()
    stored = fetch_media_to_store(
        url,
        store,
        lambda content_type, variant: KEY,
        promised="video",
        watermark_text="recon",
        max_bytes=1 << 40,
        max_image_bytes=64 * MIB,
        allowed_hosts={url.split("/")[2]},
    )
    seconds, cpu = time.perf_counter() - started, _cpu_s() - cpu_before
    traced_peak = tracemalloc.get_traced_memory()[1] / MIB if trace else None
    if trace:
        tracemalloc.stop()
    _, peak = _memory_mb()
    return {
        "stored_bytes": stored.size,
        "seconds": seconds,
        "cpu_s": cpu,
        "rss_after_imports_mb": rss_after_imports,
        "peak_rss_mb": peak,
        "tracemalloc_peak_mb": traced_peak,
        "path": os.path.join(workdir, KEY),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mb", type=int, default=256, help="source video size in MiB (default 256)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument(
        "--no-tracemalloc", action="store_true", help="skip tracemalloc (its own tables cost RSS)"
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    parser.add_argument("--run-case", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.file)
        return 0
    if args.run_case:
        print(json.dumps(run_case(args.run_case, args.workdir, not args.no_tracemalloc)))
        return 0

    import av

    workdir = tempfile.mkdtemp(prefix="recon-video-bench-")
    source = os.path.join(workdir, "source.avi")
    server = None
    try:
        started = time.perf_counter()
        frames = make_video(source, args.size_mb, args.width, args.height)
        size = os.path.getsize(source)
        print(
            f"source: {size} bytes ({size / MIB:.0f} MiB), {frames} frames {args.width}x{args.height} MJPEG, "
            f"made in {time.perf_counter() - started:.1f} s"
        )
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(port), "--file", source],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_port(port)
        command = [
            sys.executable,
            __file__,
            "--run-case",
            f"http://127.0.0.1:{port}/v.avi",
            "--workdir",
            workdir,
        ]
        if args.no_tracemalloc:
            command.append("--no-tracemalloc")
        answer = subprocess.run(command, capture_output=True, text=True, check=False)
        if answer.returncode != 0:
            print(f"FAILED\n{answer.stderr[-3000:]}")
            return 1
        r = json.loads(answer.stdout.strip().splitlines()[-1])
        with av.open(r["path"]) as marked:
            out_frames = sum(1 for _ in marked.decode(video=0))
        ok = r["peak_rss_mb"] < BUDGET_MB and out_frames == frames
        print(
            f"HEADLINE watermarking a {size / MIB:.0f} MiB video ({frames} frames): whole process peak "
            f"{r['peak_rss_mb']:.1f} MB (after imports {r['rss_after_imports_mb']:.1f}, tracemalloc "
            f"{r['tracemalloc_peak_mb'] or 0:.1f}), {r['seconds']:.1f} s, {r['cpu_s']:.1f} CPU s; stored "
            f"{r['stored_bytes']} bytes, {out_frames} frames decoded back; "
            f"{'ok' if ok else f'OVER the {BUDGET_MB} MB budget or frames lost'}"
        )
        return 0 if ok else 1
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
