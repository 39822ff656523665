"""The fault harness's checks: every job of a sweep against the invariants (terminal, charged once
and the right way, one upstream create at most, no media left behind), as one report row per case."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from recon_dagster_tests.chaos.worlds import START_BALANCE, Job
from recon_dagster_tests.support.sandbox_process import SandboxProcess


@dataclass
class PointReport:
    """The Jepsen-style row of one crash point (one path)."""

    case: str
    trials: int = 0
    completed: int = 0
    failed_refunded: int = 0
    lost: int = 0
    double_commits: int = 0
    double_refunds: int = 0
    mismatched: int = 0  # completed but refunded, failed but charged, completed without media
    duplicate_creates: int = 0
    leftover_objects: int = 0
    leftover_parts: int = 0
    rounds: int = 0
    killed_at_point: int = 0
    seeds: list[int] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)  # job ids of violations, for reproduction

    @property
    def violations(self) -> int:
        return (
            self.lost + self.double_commits + self.double_refunds + self.mismatched
            + self.duplicate_creates + self.leftover_objects + self.leftover_parts
        )  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "violations": self.violations}


def media_files(media_dir: Path) -> list[Path]:
    return [p for p in media_dir.rglob("*") if p.is_file()]


def check(
    engine: sa.Engine, sandbox: SandboxProcess, media_dir: Path, jobs: Sequence[Job]
) -> dict[str, PointReport]:
    """Every job against the invariants, grouped by case."""
    reports: dict[str, PointReport] = {}
    files = media_files(media_dir)
    by_job: dict[str, list[Path]] = {}
    for f in files:
        for part in f.parts:
            by_job.setdefault(part, []).append(f)
    with engine.connect() as conn:
        rows = {
            str(r.id): r
            for r in conn.execute(
                sa.text(
                    """
                    SELECT j.id, j.status,
                      (SELECT array_agg(u.status::text) FROM usage_logs u WHERE u.job_id = j.id) AS usage,
                      uc.subscription_credits + uc.topup_credits AS balance,
                      (SELECT count(*) FROM assets a WHERE a.job_id = j.id) AS assets
                    FROM jobs j JOIN user_credits uc ON uc.user_id = j.user_id
                    WHERE j.id = ANY(CAST(:ids AS uuid[]))
                    """
                ),
                {"ids": [str(j.id) for j in jobs]},
            )
        }
    creates = sandbox_creates(sandbox, [j.id for j in jobs])
    for job in jobs:
        rep = reports.setdefault(job.case, PointReport(job.case))
        rep.trials += 1
        row = rows[str(job.id)]
        usage = list(row.usage or [])
        balance = Decimal(row.balance)
        bad: list[str] = []
        if row.status in ("pending", "processing") or "reserved" in usage:
            rep.lost += 1
            bad.append("lost")
        elif row.status == "completed" and usage == ["committed"]:
            rep.completed += 1
        elif row.status in ("failed", "cancelled") and usage == ["refunded"]:
            rep.failed_refunded += 1
        else:
            rep.mismatched += 1
            bad.append(f"mismatch {row.status}/{usage}")
        charged = START_BALANCE - balance
        expected = job.amount if "committed" in usage else Decimal(0)
        if charged > expected:
            rep.double_commits += 1
            bad.append(f"charged {charged} expected {expected}")
        elif charged < expected or (charged < 0):
            rep.double_refunds += 1
            bad.append(f"charged {charged} expected {expected}")
        objects = [f for f in by_job.get(str(job.id), []) if not f.name.endswith(".part")]
        parts = [f for f in by_job.get(str(job.id), []) if f.name.endswith(".part")]
        if row.status == "completed" and (not objects or row.assets != 1):
            rep.mismatched += 1
            bad.append(f"completed with {len(objects)} objects, {row.assets} assets")
        if row.status != "completed" and objects:
            rep.leftover_objects += 1
            bad.append(f"{len(objects)} media objects left")
        if parts:
            rep.leftover_parts += 1
            bad.append(f"{len(parts)} .part files left")
        allowed = 1 if job.case.startswith("worker:") else 0
        if creates.get(str(job.id), 0) > allowed:
            rep.duplicate_creates += 1
            bad.append(f"{creates[str(job.id)]} upstream creates")
        if bad and len(rep.examples) < 5:
            rep.examples.append(f"{job.id}: {'; '.join(bad)}")
    return reports


def sandbox_creates(sandbox: SandboxProcess, ids: Sequence[uuid.UUID]) -> dict[str, int]:
    """Upstream creates per job id (the worker's create body carries the job id)."""
    return {str(i): sandbox.creates_for(str(i)) for i in ids}


def merge(into: PointReport, rep: PointReport) -> None:
    for name in (
        "trials", "completed", "failed_refunded", "lost", "double_commits", "double_refunds",
        "mismatched", "duplicate_creates", "leftover_objects", "leftover_parts",
    ):  # fmt: skip
        setattr(into, name, getattr(into, name) + getattr(rep, name))
    into.examples.extend(rep.examples[: max(0, 5 - len(into.examples))])
