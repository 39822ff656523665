"""Backlog recovery through the real dagster-daemon: 10,000 stale jobs, then one run per job.

Everything is real and on loopback: the provider sandbox as its own process (every provider
answer delayed by ``--latency``), a temporary DAGSTER_HOME on dagster-postgres, ``dagster-daemon``
with its sensor, queued run coordinator and run workers, all on a fresh PostgreSQL database.

Phase 1 (backlog): ``--jobs`` stale rows across kinds (async kinds whose upstream task already
succeeded, about 10% that failed upstream, about 5% sync kinds that can only be swept), each with
its credits reserved. Measures the time from the daemon's start until every row is terminal,
packed into batched runs by the sensor.

Phase 2 (one run per job): ``--sample`` succeeded async jobs with batching disabled
(``RECON_BATCH_SIZE=1``, ``RECON_SINGLE_RUN_BELOW`` above the sample), i.e. one Dagster run per job.

Prints jobs/minute for both, their ratio, CPU seconds per reconciled job (the daemon and every
process under it: code server and run workers, reaped ones included), and verifies that nothing
was settled twice: every usage_log settled exactly once, committed for completed jobs and refunded
for failed ones, credits conserved per user, one reconcile outcome per job, no upstream create.
Targets (2 cores): phase 1 >= 2,000 jobs/min, >= 40x phase 2.

``--ceiling`` runs the account-budget benchmark instead (``benchmarks/ceiling.py``): a backlog of
two providers drained under one shared read budget per account, then with per-process limits.
``--fairness`` runs ``benchmarks/fairness.py``: late stuck jobs of one kind during another
kind's backlog under a binding budget (stale -> terminal p50/max next to the drain time).
``--storm`` runs ``benchmarks/storm.py``: a KIE backlog through one Retry-After of 120 s (polls
per minute before, during and after; jobs force-failed by our own limiter; settled twice).

    .venv/bin/python benchmarks/backlog.py [--jobs 10000] [--latency 0.1] [--sample 60]
        [--database-url URL] [--max-concurrent-runs 10] [--batch-size 500] [--concurrency 16]
        [--limits unbounded|shipped|process]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass

import psutil
import sqlalchemy as sa

# The test harness (recon_dagster_tests) is not installed: it is imported from the checkout.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import (
    LIMIT_MODES,
    WATERMARK,
    Seeded,
    compile_project,
    connections,
    inflight,
    log,
    seed,
    verify,
)

from recon_dagster import config
from recon_dagster.db.budget import check_run_queue
from recon_dagster.db.engine import (
    DATABASE_URL_ENV,
    dispose_engines,
    get_engine,
    normalize_url,
    redact,
    resolve_database_url,
    with_database,
)
from recon_dagster.db.migrate import migrate
from recon_dagster.defs.resources import ReconcileSettingsResource
from recon_dagster_tests.support.daemon import DaemonProcess, daemon_process
from recon_dagster_tests.support.instance import DagsterHome, dagster_home, drop_database, ensure_database
from recon_dagster_tests.support.sandbox_process import sandbox_process

TARGET_JOBS_PER_MIN = 2000
TARGET_RATIO = 40

# This benchmark's own connections carry this name, so they are not counted against the budget.
BENCHMARK_APPLICATION = "recon-backlog-benchmark"


def connections_by_database(engine: sa.Engine, app_db: str, storage_db: str) -> tuple[int, int]:
    """(connections to the app's database but this benchmark's own, connections to Dagster's storage)."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT count(*) FILTER (WHERE datname = :app AND application_name <> :me), "
                "count(*) FILTER (WHERE datname = :storage) FROM pg_stat_activity"
            ),
            {"app": app_db, "storage": storage_db, "me": BENCHMARK_APPLICATION},
        ).one()
    return int(row[0]), int(row[1])


def process_role(proc: psutil.Process) -> str:
    """Which part of the deployment a process of the daemon's tree is."""
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if "dagster-daemon" in cmd:
        return "daemon"
    if "api grpc" in cmd:
        return "code server"
    if "spawn_main" in cmd or "execute_run" in cmd:
        return "run workers"
    return "other"


class CpuSplit:
    """CPU seconds by role (daemon, code server, run workers), from each process's own times
    sampled every tick: a run worker that exits between two samples loses at most one interval,
    so the split is a lower bound of the daemon-tree figure, which counts reaped children too."""

    def __init__(self) -> None:
        self._own: dict[int, tuple[str, float]] = {}

    def sample(self, root_pid: int) -> None:
        try:
            root = psutil.Process(root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in procs:
            try:
                t = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            role = self._own[proc.pid][0] if proc.pid in self._own else process_role(proc)
            self._own[proc.pid] = (role, t.user + t.system)

    def by_role(self) -> dict[str, tuple[int, float]]:
        """role -> (processes seen, CPU seconds)."""
        out: dict[str, tuple[int, float]] = {}
        for role, cpu in self._own.values():
            n, total = out.get(role, (0, 0.0))
            out[role] = (n + 1, total + cpu)
        return out


@dataclass
class PhaseResult:
    jobs: int
    wall_s: float  # daemon start -> last job terminal
    runs_s: float  # first run started -> last run ended (Dagster's records)
    runs: int
    runs_failed: int
    cpu_s: float
    sandbox_cpu_s: float
    machine_cpu_s: float
    peak_connections: int  # pg_stat_activity on the whole server, sampled every 0.5 s
    cpu_by_role: dict[str, tuple[int, float]] | None = None
    peak_app_connections: int = 0  # to the app's database (the budget's), this benchmark's own excluded
    peak_storage_connections: int = 0  # to Dagster's storage database (not in the budget)

    @property
    def per_min_wall(self) -> float:
        return self.jobs / self.wall_s * 60

    @property
    def per_min_runs(self) -> float:
        return self.jobs / self.runs_s * 60 if self.runs_s > 0 else float("nan")


def run_phase(
    name: str,
    engine: sa.Engine,
    home: DagsterHome,
    sandbox,
    seeded: Seeded,
    env: dict[str, str],
    *,
    timeout_s: float,
) -> PhaseResult:
    """Start a daemon, wait until every seeded job is terminal, stop it; returns the figures."""
    ids = seeded.job_ids
    with home.instance() as inst:
        runs_before = {r.run_id for r in inst.get_runs()}
    machine_before = psutil.cpu_times()
    sandbox_before = sandbox.cpu_seconds()
    started = time.monotonic()
    daemon: DaemonProcess
    with daemon_process(home, env) as daemon:
        last_print = 0.0
        left = len(ids)
        peak = peak_app = peak_storage = 0
        app_db = engine.url.database or ""
        split = CpuSplit()
        while True:
            split.sample(daemon.pid)
            left = inflight(engine, ids)
            peak = max(peak, connections(engine))
            app, storage = connections_by_database(engine, app_db, home.storage_database)
            peak_app, peak_storage = max(peak_app, app), max(peak_storage, storage)
            now = time.monotonic()
            if left == 0:
                break
            if not daemon.alive():
                raise SystemExit(f"{name}: the daemon died:\n{daemon.log_tail()}")
            if now - started > timeout_s:
                raise SystemExit(
                    f"{name}: {left:,} jobs still in flight after {timeout_s:g} s\n{daemon.log_tail()}"
                )
            if now - last_print >= 10:
                log(f"  [{name}] {now - started:6.1f} s: {len(ids) - left:,}/{len(ids):,} terminal")
                last_print = now
            time.sleep(0.5)
        wall_s = time.monotonic() - started
        log(f"  [{name}] all {len(ids):,} terminal after {wall_s:.1f} s; waiting for runs to finish")
        with home.instance() as inst:
            deadline = time.monotonic() + 120
            while True:
                runs = [r for r in inst.get_runs() if r.run_id not in runs_before]
                if all(r.is_finished for r in runs) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            records = [
                rec
                for rec in inst.get_run_records()
                if rec.dagster_run.run_id not in runs_before and rec.dagster_run.job_name == "reconcile_job"
            ]
        split.sample(daemon.pid)
        cpu_s = daemon.cpu_seconds()
    machine_after = psutil.cpu_times()
    machine_cpu_s = sum(machine_after) - sum(machine_before) - (machine_after.idle - machine_before.idle)
    machine_cpu_s -= getattr(machine_after, "iowait", 0) - getattr(machine_before, "iowait", 0)
    starts = [r.start_time for r in records if r.start_time]
    ends = [r.end_time for r in records if r.end_time]
    runs_s = (max(ends) - min(starts)) if starts and ends else float("nan")
    failed = sum(1 for r in records if r.dagster_run.status.value != "SUCCESS")
    return PhaseResult(
        len(ids),
        wall_s,
        runs_s,
        len(records),
        failed,
        cpu_s,
        sandbox.cpu_seconds() - sandbox_before,
        machine_cpu_s,
        peak,
        split.by_role(),
        peak_app,
        peak_storage,
    )


def _telemetry_env() -> dict[str, str]:
    """Telemetry on for the daemon tree: /metrics on a free port, OTLP/HTTP to a loopback sink
    that answers 200 to everything (the exporters' encoding and sending are the cost measured)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    Thread(target=server.serve_forever, daemon=True).start()
    return {
        "RECON_TELEMETRY": "1",
        "RECON_METRICS_PORT": "0",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
    }


def main() -> int:
    if "--ceiling" in sys.argv[1:]:  # the account-budget benchmark (benchmarks/ceiling.py)
        from ceiling import main as ceiling_main

        return ceiling_main([a for a in sys.argv[1:] if a != "--ceiling"])
    if "--fairness" in sys.argv[1:]:  # a fresh stuck job during another kind's backlog (fairness.py)
        from fairness import main as fairness_main

        return fairness_main([a for a in sys.argv[1:] if a != "--fairness"])
    if "--storm" in sys.argv[1:]:  # a 429 storm in a KIE backlog (storm.py)
        from storm import main as storm_main

        return storm_main([a for a in sys.argv[1:] if a != "--storm"])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds per sandbox answer")
    parser.add_argument("--sample", type=int, default=60, help="jobs for the one-run-per-job rate (0: skip)")
    parser.add_argument(
        "--database-url", default=None, help="server to use (default RECON_DATABASE_URL, else embedded)"
    )
    parser.add_argument("--max-concurrent-runs", type=int, default=10)
    parser.add_argument(
        "--kind-run-limit", type=int, default=3, help="queued runs per provider_kind (0: none)"
    )
    # The project default (RECON_BATCH_SIZE), so the figures describe what ships.
    parser.add_argument("--batch-size", type=int, default=ReconcileSettingsResource.from_config().batch_size)
    parser.add_argument("--concurrency", type=int, default=16, help="jobs worked at once inside a run")
    parser.add_argument(
        "--watermark",
        choices=tuple(WATERMARK),
        default="default",
        help="the rows' should_watermark: default (NULL, which watermarks: every image and video "
        "re-encoded), on, or off (media stored as it came: the reconciliation's own cost)",
    )
    parser.add_argument("--scan-limit", type=int, default=ReconcileSettingsResource.from_config().scan_limit)
    parser.add_argument("--sensor-interval", type=int, default=5, help="RECON_SENSOR_INTERVAL_S")
    parser.add_argument("--media-bytes", type=int, default=16 * 1024)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database")
    parser.add_argument(
        "--budget",
        type=int,
        default=int(config.SETTINGS["RECON_DB_MAX_CONNECTIONS"].default),
        help="RECON_DB_MAX_CONNECTIONS for the daemon tree (--max-concurrent-runs must fit it)",
    )
    parser.add_argument(
        "--limits",
        choices=sorted(LIMIT_MODES),
        default="unbounded",
        help="account budgets: 'unbounded' (default) keeps the shared limiter on with rates and "
        "slots that never bind, so the figure is the reconciler's; 'shipped' the default budgets "
        "(KIE reads 600/min bind: see --ceiling); 'process' per-process limits only",
    )
    parser.add_argument(
        "--telemetry",
        choices=("off", "on"),
        default="off",
        help="'on': RECON_TELEMETRY=1 in the daemon tree, the code server serving /metrics on a free port and "
        "every process pushing OTLP/HTTP to a loopback sink in this process (what telemetry costs)",
    )
    args = parser.parse_args()
    for name in ("jobs", "max_concurrent_runs", "batch_size", "concurrency", "scan_limit", "sensor_interval"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.latency < 0 or args.sample < 0 or args.media_bytes < 0:
        parser.error("--latency, --sample and --media-bytes must not be negative")

    problem = check_run_queue(args.max_concurrent_runs, args.budget)
    if problem:
        parser.error(problem.replace("dagster.yaml's run_queue.max_concurrent_runs", "--max-concurrent-runs"))
    server_url = (
        normalize_url(args.database_url) if args.database_url else resolve_database_url(allow_embedded=True)
    )
    name = f"recon_bench_{secrets.token_hex(4)}"
    ensure_database(server_url, name)
    url = with_database(server_url, name)
    os.environ[DATABASE_URL_ENV] = url
    rng = random.Random(args.seed)
    print(
        f"database {redact(url)}; {args.jobs:,} jobs, latency {args.latency * 1000:g} ms, "
        f"{args.max_concurrent_runs} concurrent runs (<= {args.kind_run_limit or 'any'} per kind), "
        f"batch {args.batch_size}, scan {args.scan_limit}, {args.concurrency} jobs at once per run, "
        f"account limits {args.limits}, watermark {args.watermark}, telemetry {args.telemetry}, "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    media_dir = tempfile.mkdtemp(prefix="recon-bench-media-")
    problems: list[str] = []
    try:
        named = sa.make_url(url).update_query_dict({"application_name": BENCHMARK_APPLICATION})
        engine = get_engine(named.render_as_string(hide_password=False))
        migrate(engine)
        base_env = {
            DATABASE_URL_ENV: url,
            "RECON_DB_MAX_CONNECTIONS": str(args.budget),
            "RECON_MEDIA_DIR": media_dir,
            "RECON_SENSOR_INTERVAL_S": str(args.sensor_interval),
            "RECON_RECONCILE_CONCURRENCY": str(args.concurrency),
            "RECON_SCAN_LIMIT": str(args.scan_limit),
            **LIMIT_MODES[args.limits],
            **(_telemetry_env() if args.telemetry == "on" else {}),
        }
        compile_project()
        with (
            sandbox_process(latency_s=args.latency) as sandbox,
            dagster_home(
                url,
                max_concurrent_runs=args.max_concurrent_runs,
                kind_run_limit=args.kind_run_limit or None,
            ) as home,
        ):
            env = {**base_env, **sandbox.env}
            log("phase 1: backlog")
            backlog = seed(
                engine, sandbox, args.jobs, prefix="bl", fail_share=0.10, sync_share=0.05,
                media_bytes=args.media_bytes, rng=rng, watermark=WATERMARK[args.watermark],
            )  # fmt: skip
            batched = run_phase(
                "batched",
                engine,
                home,
                sandbox,
                backlog,
                {**env, "RECON_BATCH_SIZE": str(args.batch_size)},
                timeout_s=args.timeout,
            )
            problems += [f"backlog: {p}" for p in verify(engine, backlog)]
            single = None
            if args.sample:
                log("phase 2: one run per job")
                sample = seed(
                    engine, sandbox, args.sample, prefix="one", fail_share=0.0, sync_share=0.0,
                    media_bytes=args.media_bytes, rng=rng, watermark=WATERMARK[args.watermark],
                )  # fmt: skip
                single = run_phase(
                    "one-per-job",
                    engine,
                    home,
                    sandbox,
                    sample,
                    {**env, "RECON_BATCH_SIZE": "1", "RECON_SINGLE_RUN_BELOW": str(args.sample + 1)},
                    timeout_s=args.timeout,
                )
                problems += [f"sample: {p}" for p in verify(engine, sample)]
            creates = sandbox.creates_total()
            if creates:
                problems.append(f"the sandbox saw {creates} creates; reconciliation must never create")
    finally:
        dispose_engines()
        if not args.keep:
            drop_database(server_url, name)
        import shutil

        shutil.rmtree(media_dir, ignore_errors=True)

    def show(label: str, r: PhaseResult) -> None:
        print(
            f"{label}: {r.jobs:,} jobs terminal in {r.wall_s:.1f} s from daemon start = {r.per_min_wall:,.0f} jobs/min; "
            f"{r.runs} runs ({r.runs_failed} not successful) over {r.runs_s:.1f} s = {r.per_min_runs:,.0f} jobs/min; "
            f"CPU {r.cpu_s:.1f} s daemon tree = {r.cpu_s / r.jobs * 1000:.1f} ms/job "
            f"(sandbox {r.sandbox_cpu_s:.1f} s, whole machine {r.machine_cpu_s:.1f} s = "
            f"{r.machine_cpu_s / r.jobs * 1000:.1f} ms/job); "
            f"peak {r.peak_connections} PostgreSQL connections on the server"
        )
        print(
            f"  connections: peak {r.peak_app_connections} to the app's database against a budget of "
            f"{args.budget} (RECON_DB_MAX_CONNECTIONS), {'within' if r.peak_app_connections <= args.budget else 'OVER'} "
            f"it; peak {r.peak_storage_connections} to Dagster's storage database (not in the budget)"
        )
        if r.cpu_by_role:
            print(
                "  CPU by role (own times sampled every 0.5 s): "
                + ", ".join(
                    f"{role} {cpu:.1f} s ({n} process{'es' if n != 1 else ''}, {cpu / r.jobs * 1000:.1f} ms/job)"
                    for role, (n, cpu) in sorted(r.cpu_by_role.items(), key=lambda kv: -kv[1][1])
                )
            )

    show("batched", batched)
    met = batched.per_min_wall >= TARGET_JOBS_PER_MIN
    if single is not None:
        show("one run per job", single)
        ratio_wall = batched.per_min_wall / single.per_min_wall
        ratio_runs = batched.per_min_runs / single.per_min_runs
        print(
            f"ratio batched / one-per-job: {ratio_wall:.1f}x (wall from daemon start), {ratio_runs:.1f}x (run spans)"
        )
        met = met and ratio_wall >= TARGET_RATIO
    print(
        f"verification: {'OK, nothing settled twice, credits conserved, 0 creates' if not problems else 'FAILED'}"
    )
    for p in problems:
        print(f"  - {p}")
    print(
        f"targets: >= {TARGET_JOBS_PER_MIN:,} jobs/min batched, >= {TARGET_RATIO}x one-per-job: "
        f"{'met' if met else 'NOT met'}"
    )
    print(
        json.dumps({"batched": batched.__dict__, "single": single.__dict__ if single else None}, default=str)
    )
    return 0 if met and not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
