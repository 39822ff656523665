"""Shadow agreement: each shadow decision against what became of its job afterwards.

Per job (all its shadow decisions, the latest one deciding unless one of them would have refunded):

- **harmful**: shadow would have failed and refunded (fail, sweep, force-fail) a job that then
  completed (the app's worker or a webhook finished it): enforcing would have failed real work;
- **disagree**: shadow would have completed and charged a job that then failed or was cancelled
  (enforce would have delivered a result the app gave up on: worth a look, nobody harmed);
- **agree**: the job ended the way shadow said (or shadow only waited and the job ended);
- **pending**: the job is still in flight; **gone**: the job row no longer exists.

The ``shadow_agreement`` asset carries the counts per kind; its check fails on any harmful
disagreement and lists the job ids. ``recon-dagster plan --shadow-report`` prints the same.
"""

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import sqlalchemy as sa

from recon_dagster.config import Settings
from recon_dagster.db.jobs import INFLIGHT_STATUSES
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.reconcile.plan import REFUNDING, PlanAction

VERDICTS = ("harmful", "disagree", "agree", "pending", "gone")
SHADOW_AGREEMENT = dg.AssetKey("shadow_agreement")


def verdict(latest: str, would_refund: bool, status: str | None) -> str:
    """One job's verdict from its latest shadow action, whether any would refund, and its status now."""
    if status is None:
        return "gone"
    if status in INFLIGHT_STATUSES:
        return "pending"
    if status == "completed":
        return "harmful" if would_refund else "agree"
    return "disagree" if latest == PlanAction.COMPLETE.value else "agree"


@dataclass(frozen=True)
class JobVerdict:
    job_id: str
    kind: str | None
    latest: str
    decisions: int
    status: str | None
    verdict: str


@dataclass
class Report:
    jobs: list[JobVerdict] = field(default_factory=list)

    @property
    def harmful(self) -> list[JobVerdict]:
        return [j for j in self.jobs if j.verdict == "harmful"]

    def by_kind(self) -> dict[str, Counter[str]]:
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for j in self.jobs:
            out[j.kind or "(none)"][j.verdict] += 1
        return dict(sorted(out.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "by_kind": {k: {v: c[v] for v in VERDICTS} for k, c in self.by_kind().items()},
            "harmful": [j.job_id for j in self.harmful],
            "disagree": [j.job_id for j in self.jobs if j.verdict == "disagree"],
            "jobs": [j.__dict__ for j in self.jobs],
        }


_REFUNDING = ", ".join(f"'{a.value}'" for a in sorted(REFUNDING))

_REPORT_SQL = sa.text(
    f"""
    SELECT d.job_id, min(d.provider_kind) AS kind, count(*) AS decisions,
      (array_agg(d.action ORDER BY d.created_at DESC, d.id DESC))[1] AS latest,
      bool_or(d.action IN ({_REFUNDING})) AS would_refund,
      j.status
    FROM reconcile_decisions d LEFT JOIN jobs j ON j.id = d.job_id
    WHERE d.mode = 'shadow' AND (CAST(:kind AS text) IS NULL OR d.provider_kind = :kind)
    GROUP BY d.job_id, j.status
    ORDER BY d.job_id
    """
)


def agreement_report(engine: sa.Engine, *, kind: str | None = None) -> Report:
    with engine.connect() as conn:
        rows = conn.execute(_REPORT_SQL, {"kind": kind}).all()
    return Report(
        [
            JobVerdict(
                str(r.job_id),
                r.kind,
                r.latest,
                int(r.decisions),
                r.status,
                verdict(r.latest, r.would_refund, r.status),
            )
            for r in rows
        ]
    )


def report_text(report: Report) -> str:
    if not report.jobs:
        return (
            f"no shadow decisions recorded ({Settings.mode.name}=shadow or {Settings.shadow_kinds.name} "
            "turns shadow on)"
        )
    lines = [f"{'kind':<24}" + "".join(f"{v:>10}" for v in VERDICTS)]
    for k, c in report.by_kind().items():
        lines.append(f"{k:<24}" + "".join(f"{c[v]:>10}" for v in VERDICTS))
    for j in report.jobs:
        if j.verdict in ("harmful", "disagree"):
            lines.append(
                f"{j.verdict}: job {j.job_id} [{j.kind or 'no kind'}] shadow said {j.latest}, job is {j.status}"
            )
    lines.append(
        f"{len(report.harmful)} harmful disagreement(s)"
        + ("" if report.harmful else ": agreement holds for every decided job")
    )
    return "\n".join(lines)


@dg.asset(
    key=SHADOW_AGREEMENT,
    group_name="reconciliation",
    description="Shadow decisions compared with what became of each job: agree / disagree / harmful "
    "(shadow would have failed and refunded a job that then completed) / pending, per provider kind.",
    check_specs=[
        dg.AssetCheckSpec(
            "no_harmful_disagreement",
            asset=SHADOW_AGREEMENT,
            description="Fails when shadow would have failed and refunded a job that then completed; "
            "lists the job ids. Do not enforce that kind until it passes (docs/rollout.md).",
        )
    ],
)
def shadow_agreement(
    context: dg.AssetExecutionContext, database: DatabaseResource
) -> Iterator[dg.MaterializeResult[Any] | dg.AssetCheckResult]:
    report = agreement_report(database.get_engine())
    data = report.to_json()
    harmful = data["harmful"]
    yield dg.MaterializeResult(
        metadata={
            "decided_jobs": len(report.jobs),
            "harmful": len(harmful),
            "by_kind": dg.MetadataValue.json(data["by_kind"]),
            "report": dg.MetadataValue.md(f"```\n{report_text(report)}\n```"),
        }
    )
    yield dg.AssetCheckResult(
        check_name="no_harmful_disagreement",
        passed=not harmful,
        metadata={"harmful_job_ids": dg.MetadataValue.json(harmful[:200]), "count": len(harmful)},
        description=(
            f"{len(harmful)} job(s) shadow would have failed and refunded completed afterwards"
            if harmful
            else "no harmful disagreement"
        ),
    )


shadow_agreement_job = dg.define_asset_job(
    "shadow_agreement_job",
    selection=dg.AssetSelection.assets(SHADOW_AGREEMENT),
    executor_def=dg.in_process_executor,
    description="Compare shadow decisions with what became of their jobs (docs/rollout.md).",
)

shadow_agreement_schedule = dg.ScheduleDefinition(
    name="shadow_agreement_schedule",
    job=shadow_agreement_job,
    cron_schedule="*/15 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every 15 minutes: refresh the shadow agreement report and its check.",
)
