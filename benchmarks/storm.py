"""A 429 storm in a KIE backlog (``backlog.py --storm``, issue 34).

``--jobs`` KIE jobs spread over KIE's asynchronous kinds, every upstream task already succeeded,
drained by the real ``dagster-daemon`` under the shipped KIE account budget (reads 600/min, 48
concurrent requests, shared through PostgreSQL) and the shipped run-queue limits (dagster.yaml).
The job polled at mid-drain is answered once with HTTP 429 and ``Retry-After: --retry-after``
(120 s: the most a provider client honours), which blocks the whole account for every process.

Prints polls served per minute before, during and after the block (from the sandbox's own
request log), how long after the block ended the account served its budget again (the first
10 s window at 90% of the bucket's rate), the per-minute timeline, and the money figures: jobs
force-failed by a refusal of our own limiter (must be 0), jobs settled twice (must be 0, with the
rest of ``backlog.py``'s verification), polls not sent (rescheduled, no attempt) and the
attempts counted.

``--scale S`` runs the same storm S times faster: the budget's window, the Retry-After, the poll
deadline, the cadence and the lease are divided by S (the daemon, run start and sensor interval
are not, so a scaled run is a lower bound on recovery). The figures it prints are in scaled
seconds; multiply by S for the real ones.

    PYTHONPATH=. .venv/bin/python benchmarks/backlog.py --storm [--jobs 10000] [--retry-after 120] [--scale 1]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from typing import Any

import sqlalchemy as sa
from harness import Seeded, compile_project, inflight, insert_jobs, log, shipped_run_queue, verify

from recon_dagster.core.kinds import KINDS, get_kind
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
from recon_dagster.providers.limits import Budget
from recon_dagster_tests.support.daemon import daemon_process
from recon_dagster_tests.support.instance import dagster_home, drop_database, ensure_database
from recon_dagster_tests.support.sandbox_process import sandbox_process

KIE_KINDS = sorted(k.name for k in KINDS.values() if str(k.provider) == "kie" and k.is_async)


def seed(engine: sa.Engine, sandbox: Any, count: int, retry_after_s: int) -> tuple[Seeded, str]:
    """``count`` stale KIE jobs, kinds in turn and oldest first in the order the scan takes them,
    so job ``count // 2`` is polled at mid-drain; its task answers its first poll with a 429
    carrying ``Retry-After: retry_after_s``. Returns the jobs and that job's id."""
    users = [str(uuid.uuid4()) for _ in range(max(1, min(100, count // 20)))]
    ids: list[str] = []
    kinds: list[str] = []
    user_of: list[str] = []
    ages: list[float] = []
    specs: list[tuple[str, dict[str, Any], str | None]] = []
    oldest = max(get_kind(k).stale_threshold.total_seconds() for k in KIE_KINDS) + 600 + count
    mid = count // 2
    for i in range(count):
        kind = KIE_KINDS[i % len(KIE_KINDS)]
        scenario: dict[str, Any] = {"outcome": "succeed", "polls_before_done": 0, "media_size": 1024}
        if i == mid and retry_after_s > 0:
            scenario.update(rate_limit_first=1, retry_after_s=retry_after_s)
        # The sandbox makes each task id in its provider's own shape.
        specs.append((kind, scenario, None))
        ids.append(str(uuid.uuid4()))
        kinds.append(kind)
        user_of.append(users[i % len(users)])
        ages.append(oldest - i)  # job i is older than job i + 1
    tasks: list[str | None] = list(sandbox.add_tasks(specs))
    insert_jobs(engine, ids, user_of, kinds, tasks, ages, watermark=False)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE jobs")
        conn.exec_driver_sql("ANALYZE usage_logs")
    return Seeded(ids, users, Counter({"completed": count})), ids[mid]


class BlockWatch:
    """Samples the account row every 0.2 s: when the first Retry-After arrived (the first
    ``blocked_until`` seen, less the Retry-After: the database's own clock at the block), and the
    latest ``blocked_until`` (a 429 that lands during the block pushes it out)."""

    def __init__(self, engine: sa.Engine, account: str, retry_after_s: float) -> None:
        self.engine, self.account, self.retry_after_s = engine, account, retry_after_s
        self.first: float | None = None  # unix time of the first Retry-After
        self.until: float | None = None  # unix time the block ends (the latest seen)
        self.retry_afters = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BlockWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                with self.engine.connect() as conn:
                    row = conn.execute(
                        sa.text(
                            "SELECT retry_afters, extract(epoch FROM blocked_until) AS until "
                            "FROM provider_limit_accounts WHERE account = :a"
                        ),
                        {"a": self.account},
                    ).first()
            except sa.exc.SQLAlchemyError:
                continue
            if row is None or not row.retry_afters:
                continue
            if self.first is None:
                self.first = float(row.until) - self.retry_after_s
            self.retry_afters = int(row.retry_afters)
            self.until = max(self.until or 0.0, float(row.until))


def per_minute(stamps: list[float], start: float, end: float) -> float:
    span = end - start
    return sum(start <= t < end for t in stamps) / span * 60 if span > 0 else float("nan")


def recovery_s(stamps: list[float], block_end: float, rate: float, window: float = 10.0) -> float | None:
    """Seconds from the block's end to the start of the first ``window`` serving 90% of ``rate``."""
    after = sorted(t for t in stamps if t >= block_end)
    if not after:
        return None
    t = block_end
    while t + window <= after[-1]:
        served = sum(t <= s < t + window for s in after)
        if served >= 0.9 * rate * window:
            return t - block_end
        t += 0.5
    return None


def money(engine: sa.Engine, ids: list[str]) -> dict[str, int]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                """
                SELECT
                  count(*) FILTER (WHERE outcome = 'exhausted') AS exhausted,
                  count(*) FILTER (WHERE outcome = 'exhausted' AND (detail ILIKE '%not sent%'
                                   OR detail ILIKE '%token%' OR detail ILIKE '%slot%')) AS exhausted_by_refusal,
                  count(*) FILTER (WHERE outcome = 'not_sent') AS not_sent,
                  count(*) FILTER (WHERE outcome IN ('still_running', 'error')) AS attempts_counted,
                  count(*) FILTER (WHERE outcome = 'error') AS errors
                FROM reconcile_events WHERE job_id = ANY(CAST(:ids AS uuid[]))
                """
            ),
            {"ids": ids},
        ).one()
        most = conn.execute(
            sa.text("SELECT max(reconcile_attempts) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[]))"),
            {"ids": ids},
        ).scalar_one()
    return {**row._asdict(), "most_attempts_on_a_job": int(most or 0)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--retry-after", type=int, default=120, help="seconds; 0: no 429 (the plain drain)")
    parser.add_argument(
        "--scale", type=int, default=1, help="run the storm this many times faster (divides 120)"
    )
    parser.add_argument("--latency", type=float, default=0.1, help="seconds per provider answer")
    parser.add_argument(
        "--sensor-interval", type=int, default=30, help="RECON_SENSOR_INTERVAL_S (shipped: 30)"
    )
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--timeout", type=float, default=5400)
    args = parser.parse_args(argv)
    if args.jobs < 2 or args.retry_after < 0 or args.scale < 1 or 120 % args.scale:
        parser.error("--jobs >= 2, --retry-after >= 0, --scale >= 1 dividing 120")
    s = args.scale
    window, retry_after = 60 / s, args.retry_after // s
    budget = Budget(600, window)
    rate, burst = budget.bucket()

    server_url = normalize_url(args.database_url) if args.database_url else resolve_database_url()
    name = f"recon_bench_{secrets.token_hex(4)}"
    ensure_database(server_url, name)
    url = with_database(server_url, name)
    os.environ[DATABASE_URL_ENV] = url
    media_dir = tempfile.mkdtemp(prefix="recon-bench-media-")
    account = f"bench-kie-{secrets.token_hex(3)}"
    problems: list[str] = []
    try:
        engine = get_engine(url)
        migrate(engine)
        compile_project()
        with sandbox_process(latency_s=args.latency) as sandbox, dagster_home(url) as home:
            queue = shipped_run_queue(home.dagster_yaml)
            print(
                f"database {redact(url)}; {args.jobs:,} KIE jobs over {len(KIE_KINDS)} kinds; KIE reads 600/{window:g} s "
                f"(bucket {rate:.2f}/s, burst {burst}), 48 slots, shared; one 429 with Retry-After {retry_after} s at "
                f"mid-drain; time scale {s}x; latency {args.latency * 1000:g} ms; sensor every {args.sensor_interval} s; "
                f"run queue as shipped ({queue['max_concurrent_runs']} runs); {os.cpu_count()} cores; "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            seeded, mid = seed(engine, sandbox, args.jobs, retry_after)
            log(f"  seeded {args.jobs:,} jobs; job {mid} is answered 429 once")
            env = {
                **sandbox.env,
                DATABASE_URL_ENV: url,
                "RECON_MEDIA_DIR": media_dir,
                "RECON_SENSOR_INTERVAL_S": str(args.sensor_interval),
                "RECON_LIMITS": "database",
                "RECON_LIMIT_KIE": f"reads=600/{window:g},creates=20/{10 / s:g},concurrency=48,account={account}",
                "RECON_POLL_DEADLINE_S": str(60 / s),
                "RECON_RECONCILE_CADENCE_S": str(300 / s),
                "RECON_LEASE_S": str(900 / s),
                "DAGSTER_GRPC_TIMEOUT_SECONDS": "300",
            }
            started = time.time()
            with daemon_process(home, env) as daemon, BlockWatch(engine, account, retry_after) as watch:
                last = 0.0
                while (left := inflight(engine, seeded.job_ids)) > 0:
                    if not daemon.alive():
                        raise SystemExit(f"the daemon died:\n{daemon.log_tail()}")
                    if time.time() - started > args.timeout:
                        raise SystemExit(f"{left:,} jobs left after {args.timeout:g} s\n{daemon.log_tail()}")
                    if time.time() - last >= 30:
                        blocked = f"; blocked until +{watch.until - started:.0f} s" if watch.until else ""
                        log(
                            f"  {time.time() - started:6.0f} s: {args.jobs - left:,}/{args.jobs:,} terminal{blocked}"
                        )
                        last = time.time()
                    time.sleep(0.5)
                drained = time.time()
            stamps = sorted(sandbox.requests("kie", "read")["timestamps"])
            figures = money(engine, seeded.job_ids)
            problems += verify(engine, seeded)
            if sandbox.creates_total():
                problems.append("the sandbox saw creates; reconciliation must never create")
    finally:
        dispose_engines()
        drop_database(server_url, name)
        shutil.rmtree(media_dir, ignore_errors=True)

    first_poll = stamps[0] if stamps else started
    hit, until = watch.first, watch.until
    timeline = Counter(int((t - first_poll) // 60) for t in stamps)
    print("polls served per minute (minute from the first poll: count): " + ", ".join(
        f"{m}: {timeline[m]}" for m in range(max(timeline, default=-1) + 1)
    ))  # fmt: skip
    out: dict[str, Any] = {
        "drain_s": drained - started,
        "polls": len(stamps),
        "budget_per_min": rate * 60,
        **figures,
    }
    if hit is not None and until is not None:
        back = recovery_s(stamps, until, rate)
        out.update(
            before_per_min=per_minute(stamps, first_poll, hit),
            during_per_min=per_minute(stamps, hit, until),
            after_per_min=per_minute(stamps, until, stamps[-1] if stamps else until),
            block_s=until - hit,
            retry_afters=watch.retry_afters,
            back_to_budget_s=back,
        )
        print(
            f"polls per minute: before the 429 {out['before_per_min']:.0f}, during the {out['block_s']:.0f} s block "
            f"{out['during_per_min']:.0f}, after it {out['after_per_min']:.0f} (budget {rate * 60:.0f}/min); "
            f"{watch.retry_afters} Retry-After(s) recorded; the account served 90% of its rate again "
            + (f"{back:.1f} s after the block ended" if back is not None else "never")
            + f" (target <= 5 s{' scaled' if s > 1 else ''})"
        )
    else:
        print(
            f"no Retry-After was recorded; drain at {per_minute(stamps, first_poll, stamps[-1]):.0f} polls/min"
        )
    print(
        f"{args.jobs:,} jobs drained in {out['drain_s']:.0f} s; force-failed at the cap: {figures['exhausted']} "
        f"(by a refusal of our own limiter: {figures['exhausted_by_refusal']}, must be 0); polls not sent "
        f"(rescheduled, no attempt): {figures['not_sent']}; attempts counted: {figures['attempts_counted']} "
        f"({figures['errors']} errors); most attempts on one job: {figures['most_attempts_on_a_job']}"
    )
    print(
        f"verification: {'OK, 0 settled twice, credits conserved, 0 creates' if not problems else 'FAILED'}"
    )
    for p in problems:
        print(f"  - {p}")
    print(json.dumps(out, default=str))
    return 0 if not problems and figures["exhausted_by_refusal"] == 0 else 1
