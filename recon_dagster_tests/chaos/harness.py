"""The fault harness: SIGKILL real processes at named crash points, recover through the real CLI,
then check every job against the invariants. Shared by ``benchmarks/chaos.py`` (full runs) and
``recon_dagster_tests/chaos/`` (the fast mode in the default suite).

One *campaign* is, for each crash point (and each path that reaches it: an app worker, or
``recon-dagster reconcile --once``), some *rounds*. A round seeds a batch of jobs with credits
reserved, each with a seeded upstream scenario, and starts one process that works all of them at
once with ``RECON_CRASH_AT=<point>`` and ``RECON_CRASH_HOLD=1``: every job that reaches the point
parks there and the process SIGKILLs itself when the last expected one arrives, so each job is a
trial of "the process died exactly here". After every round, the clock is moved a day forward (all
timestamps of the campaign's rows shifted back) and ``reconcile --once`` runs until nothing is in
flight. Then, per job: terminal, credits settled once and the right way, one upstream create at
most, no media left for a job that did not complete.

Faults without a crash point: ``sandbox.outage`` (poll bursts of 429/5xx past the client's
retries, so the worker gives up mid-job) and ``postgres.restart`` (the embedded server stopped and
started under a running worker).

Split by concern: ``worlds`` (cases, seeding), ``runner`` (rounds, recovery), ``checks`` (the
invariants); this module runs the campaign and prints its table.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from recon_dagster_tests.chaos.checks import PointReport, check, merge
from recon_dagster_tests.chaos.runner import RoundResult, base_env, reconcile_env, recover, run_round
from recon_dagster_tests.chaos.worlds import CASES, Job
from recon_dagster_tests.support.sandbox_process import SandboxProcess


@dataclass
class Campaign:
    seed: int
    jobs_per_round: int
    rounds_per_case: int
    cases: tuple[tuple[str, str], ...] = CASES
    reports: dict[str, PointReport] = field(default_factory=dict)
    rounds: list[RoundResult] = field(default_factory=list)
    recovery_passes: int = 0
    seconds: float = 0.0


def round_seed(campaign_seed: int, case_index: int, round_index: int) -> int:
    return campaign_seed * 100_000 + case_index * 1000 + round_index


def run_campaign(
    engine: sa.Engine,
    database_url: str,
    sandbox: SandboxProcess,
    media_dir: Path,
    *,
    seed: int,
    jobs_per_round: int,
    rounds_per_case: int,
    cases: Sequence[tuple[str, str]] = CASES,
    workdir: Path | None = None,
    progress: Any = None,
    parallel: int = 2,
    on_sweep: Any = None,
) -> Campaign:
    """``rounds_per_case`` sweeps; a sweep is one round of every case, then one recovery over all
    of their jobs, then the checks. ``parallel`` worker rounds run at once."""
    started = time.monotonic()
    campaign = Campaign(seed, jobs_per_round, rounds_per_case, tuple(cases))
    work = Path(workdir or tempfile.mkdtemp(prefix="recon-chaos-"))
    env = reconcile_env(base_env(database_url, sandbox, media_dir), jobs_per_round)
    for r in range(rounds_per_case):
        # One sweep: a round of every case, then one recovery over all of their jobs.
        sweep: list[Job] = []
        results: dict[str, RoundResult] = {}

        def one(path: str, point: str, r: int = r) -> tuple[list[Job], RoundResult]:
            # Indexed in CASES, so a round's seed is the same whichever cases a run selects.
            seed_r = round_seed(seed, CASES.index((path, point)), r)
            return run_round(
                engine, database_url, sandbox, media_dir, work, f"{path}:{point}", seed_r, jobs_per_round
            )

        # `reconcile --once` works every due job, so those rounds run one at a time; worker rounds
        # touch only their own jobs and may overlap.
        done = [one(p, q) for p, q in cases if p == "reconcile"]
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            done += list(pool.map(lambda c: one(*c), [c for c in cases if c[0] != "reconcile"]))
        for jobs, result in done:
            campaign.rounds.append(result)
            results[result.case] = result
            sweep.extend(jobs)
        campaign.recovery_passes += recover(engine, [j.id for j in sweep], env, work)
        for case, rep in check(engine, sandbox, media_dir, sweep).items():
            total = campaign.reports.setdefault(case, PointReport(case))
            merge(total, rep)
            total.rounds += 1
            total.killed_at_point += int(results[case].killed_at_point)
            total.seeds.append(results[case].seed)
            if progress is not None:
                progress(results[case], total)
        campaign.seconds = round(time.monotonic() - started, 1)
        if on_sweep is not None:
            on_sweep(campaign)  # a long run's partial results survive an interruption
    campaign.seconds = round(time.monotonic() - started, 1)
    return campaign


TABLE_HEADER = (
    "| crash point | path | trials | completed | failed+refunded | lost | double commits | double refunds "
    "| duplicate creates | leftover objects (.part) | killed at point | seed |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def table(campaign: Campaign) -> str:
    """The per-point report as a Markdown table."""
    lines = [TABLE_HEADER]
    for case, rep in campaign.reports.items():
        path, point = case.split(":", 1)
        lines.append(
            f"| `{point}` | {path} | {rep.trials} | {rep.completed} | {rep.failed_refunded} | {rep.lost} "
            f"| {rep.double_commits} | {rep.double_refunds} | {rep.duplicate_creates} "
            f"| {rep.leftover_objects} ({rep.leftover_parts}) | {rep.killed_at_point}/{rep.rounds} "
            f"| {campaign.seed} |"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def temp_media_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="recon-chaos-media-") as d:
        yield Path(d)
