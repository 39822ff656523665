"""The fault harness's runners: one process armed at a crash point and left to die (a round), and
the recovery after it (`recon-dagster reconcile --once`, a day later each time, until nothing is in
flight)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from recon_dagster_tests.chaos.poison import poison
from recon_dagster_tests.chaos.worlds import FAULTS, POISONS, WORKER_SCRIPT, Job, expected_hits, seed_jobs
from recon_dagster_tests.support.sandbox_process import SandboxProcess


@dataclass
class RoundResult:
    case: str
    seed: int
    jobs: int
    expected_hits: int
    hits: int
    returncode: int | None
    killed_at_point: bool
    killed_by_harness: bool
    seconds: float
    inflight_after: int  # jobs the dead process left in flight (work for recovery)


def script(name: str) -> str:
    """A console script of the running interpreter's environment, else the bare name (on PATH)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def base_env(database_url: str, sandbox: SandboxProcess, media_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECON_CRASH_")}
    env.pop("DAGSTER_HOME", None)  # reconcile --once on a throwaway instance
    env.update(sandbox.env)
    env.update({"RECON_DATABASE_URL": database_url, "RECON_MEDIA_DIR": str(media_dir)})
    return env


def run_crashing(
    cmd: list[str], env: Mapping[str, str], *, timeout_s: float, log: Path
) -> tuple[int | None, bool, str]:
    """Run until the process dies; SIGKILL it ourselves after ``timeout_s``.

    Returns (returncode, killed by us, output tail)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, env=dict(env), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        killed = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return proc.returncode, killed, log.read_bytes()[-3000:].decode("utf-8", "replace")


def shift_clock(engine: sa.Engine, ids: Iterable[uuid.UUID], by: str = "1 day") -> None:
    """Move time forward for these rows: every timestamp the scan, lease and cadence read."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"""
                UPDATE jobs SET
                  provider_call_started_at = provider_call_started_at - interval '{by}',
                  started_at = started_at - interval '{by}',
                  created_at = created_at - interval '{by}',
                  reconcile_lease_expires_at = reconcile_lease_expires_at - interval '{by}',
                  reconcile_next_at = reconcile_next_at - interval '{by}'
                WHERE id = ANY(CAST(:ids AS uuid[]))
                """
            ),
            {"ids": [str(i) for i in ids]},
        )


def reconcile_env(base: Mapping[str, str], concurrency: int) -> dict[str, str]:
    """Knobs for `reconcile --once` in the harness: short cadence and attempt cap, one batch."""
    return {
        **base,
        "RECON_MAX_ATTEMPTS": "2",
        "RECON_RECONCILE_CADENCE_S": "0",
        "RECON_SINGLE_RUN_BELOW": "1",
        "RECON_BATCH_SIZE": str(max(concurrency, 1)),
        "RECON_RECONCILE_CONCURRENCY": str(max(concurrency, 1)),
        # Room for every thread parked at a crash point inside a transaction: a run's share is
        # then what its threads can hold (db/budget.py), not a slice of a real deployment's.
        "RECON_DB_MAX_CONNECTIONS": "100000",
        "RECON_LEASE_S": "120",
    }


def inflight(engine: sa.Engine, ids: Sequence[uuid.UUID]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    """
                    SELECT count(*) FROM jobs j
                    WHERE j.id = ANY(CAST(:ids AS uuid[]))
                      AND (j.status IN ('pending', 'processing')
                           OR EXISTS (SELECT 1 FROM usage_logs u WHERE u.job_id = j.id AND u.status = 'reserved'))
                    """
                ),
                {"ids": [str(i) for i in ids]},
            ).scalar_one()
        )


def recover(
    engine: sa.Engine, ids: Sequence[uuid.UUID], env: Mapping[str, str], workdir: Path, *, max_passes: int = 6
) -> int:
    """`recon-dagster reconcile --once` (a day later each time) until nothing is in flight."""
    passes = 0
    while passes < max_passes and inflight(engine, ids):
        shift_clock(engine, ids)
        passes += 1
        done = subprocess.run(
            [script("recon-dagster"), "reconcile", "--once"],
            env=dict(env), capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        (workdir / f"recover-{passes}.log").write_text(done.stdout + done.stderr)
    return passes


# --- one round ---------------------------------------------------------------------------------


def run_round(
    engine: sa.Engine,
    database_url: str,
    sandbox: SandboxProcess,
    media_dir: Path,
    workdir: Path,
    case: str,
    seed: int,
    n: int,
    *,
    timeout_s: float = 300,  # generous: a loaded 2-core machine runs 25 threads slowly
) -> tuple[list[Job], RoundResult]:
    """Seed ``n`` jobs and run one process over them armed at the case's point; it dies."""
    path, point = case.split(":", 1)
    rng = random.Random(seed)
    jobs, specs = seed_jobs(engine, sandbox, rng, n, case)
    hits_needed = expected_hits(point, jobs, path)
    crash_log = workdir / f"crash-{seed}.log"
    env = base_env(database_url, sandbox, media_dir)
    if point not in FAULTS and hits_needed:
        env.update(
            {
                "RECON_CRASH_AT": point,
                "RECON_CRASH_HITS": str(hits_needed),
                "RECON_CRASH_HOLD": "1",
                "RECON_CRASH_LOG": str(crash_log),
                "RECON_CRASH_SEED": str(seed),
            }
        )
    started = time.monotonic()
    if path == "worker":
        spec_file = workdir / f"specs-{seed}.json"
        spec_file.write_text(json.dumps(specs))
        cmd = [sys.executable, "-c", WORKER_SCRIPT, str(spec_file)]
    else:
        shift_clock(engine, [j.id for j in jobs])  # this round's jobs, and only they, are due
        if point in POISONS:
            poison(engine, rng, jobs, point)
        # Long cadence and lease: a job this run bumps or leases is not due again until recovery.
        env = {**reconcile_env(env, n), "RECON_RECONCILE_CADENCE_S": "3600", "RECON_LEASE_S": "3600"}
        cmd = [script("recon-dagster"), "reconcile", "--once"]
    rc, by_harness, _tail = run_crashing(cmd, env, timeout_s=timeout_s, log=workdir / f"round-{seed}.log")
    hits = len(crash_log.read_text().splitlines()) if crash_log.exists() else 0
    result = RoundResult(
        case, seed, n, hits_needed, hits, rc,
        killed_at_point=rc == -signal.SIGKILL and not by_harness and hits >= hits_needed > 0,
        killed_by_harness=by_harness, seconds=round(time.monotonic() - started, 2),
        inflight_after=inflight(engine, [j.id for j in jobs]),
    )  # fmt: skip
    return jobs, result
