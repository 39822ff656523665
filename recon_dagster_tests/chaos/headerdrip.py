"""The header-drip fault: the provider's host sends its response headers one line a second.

Each round seeds stale jobs on the reconcile path and runs ``recon-dagster reconcile --once`` with
the KIE base URL on a drip server (``drip_support``) and a short poll deadline. The pass must end
within the deadline plus process overhead, every connection must be closed by the client by the
deadline (+2 s), and each job must come out with one attempt counted, still in flight with its
credits reserved. Then the real sandbox answers and recovery settles every job, checked against
the same invariants as every other case.
"""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import sqlalchemy as sa

from recon_dagster_tests.chaos import checks, harness, runner, worlds
from recon_dagster_tests.support.drip import drip_server, wait_closed
from recon_dagster_tests.support.sandbox_process import SandboxProcess

CASE = "reconcile:header.drip"
DEADLINE_S = 3.0
# Starting `reconcile --once` (imports, Dagster instance, migration check) on a loaded machine.
PASS_OVERHEAD_S = 60.0


def _attempts(engine: sa.Engine, ids: list) -> list[tuple[int, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT reconcile_attempts, reconcile_last_error FROM jobs WHERE id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": [str(i) for i in ids]},
        ).all()
    return [(int(r[0]), r[1]) for r in rows]


def run_header_drip(
    engine: sa.Engine,
    database_url: str,
    sandbox: SandboxProcess,
    media_dir: Path,
    work: Path,
    *,
    seed: int,
    jobs: int,
    rounds: int,
) -> checks.PointReport:
    report = checks.PointReport(CASE)
    env = runner.base_env(database_url, sandbox, media_dir)
    for r in range(rounds):
        seed_r = harness.round_seed(seed, len(worlds.CASES) + 1, r)
        batch, _ = worlds.seed_jobs(engine, sandbox, random.Random(seed_r), jobs, CASE)
        ids = [j.id for j in batch]
        runner.shift_clock(engine, ids)
        with drip_server(interval_s=1.0) as drip:
            drip_env = {
                **runner.reconcile_env(env, jobs),
                "RECON_MAX_ATTEMPTS": "18",
                "RECON_POLL_DEADLINE_S": str(DEADLINE_S),
                "KIE_BASE_URL": drip.url,
                "RECON_LIMITS": "process",
            }
            started = time.monotonic()
            done = subprocess.run(
                [runner.script("recon-dagster"), "reconcile", "--once"],
                env=drip_env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            seconds = time.monotonic() - started
            (work / f"drip-{seed_r}.log").write_text(done.stdout + done.stderr)
            closed = wait_closed(drip, drip.accepted)
            longest = max(drip.closed_after_s, default=0.0)
        attempts = _attempts(engine, ids)
        held = runner.inflight(engine, ids)
        bad = [
            f"pass {seconds:.1f} s" if seconds > DEADLINE_S + PASS_OVERHEAD_S else "",
            f"a connection open {longest:.1f} s" if not closed or longest > DEADLINE_S + 2 else "",
            f"{held}/{len(ids)} in flight after the drip" if held != len(ids) else "",
            "an attempt not counted or not saying how long it waited"
            if any(n != 1 or "waited" not in (e or "") for n, e in attempts)
            else "",
        ]
        runner.recover(engine, ids, runner.reconcile_env(env, jobs), work)
        rep = checks.check(engine, sandbox, media_dir, batch)[CASE]
        rep.mismatched += sum(1 for b in bad if b)
        rep.examples.extend(f"seed {seed_r}: {b}" for b in bad if b)
        checks.merge(report, rep)
        report.rounds += 1
        report.killed_at_point += int(closed and longest <= DEADLINE_S + 2)  # column: sockets closed in time
        report.seeds.append(seed_r)
        print(
            f"{CASE} seed {seed_r}: pass {seconds:.1f} s, {drip.accepted} connections, longest open "
            f"{longest:.1f} s (deadline {DEADLINE_S:g} s)",
            flush=True,
        )
    return report
