"""Spend reconciliation: what a provider says we used, against what we charged, for one period.

Pure: no database, no HTTP, no settings. The callers (``defs/spend``) read the provider's own
record (Replicate's listed tasks, ElevenLabs' history and character stats, Anthropic's usage
report, KIE's credit balance) and our side (``usage_logs`` and the create ledger), pass the
tolerance, and get a ``SpendReport``: the provider's figure, ours, the difference, and every task
or job behind it by name. A report fails only when its difference is beyond the tolerance and the
period is final (the provider has reported all of it).

Matching a listed task to a job is the create ledger's: a task id the ledger holds names its job,
and a task carrying our job marker (``ledger.parse_marker``) names it too.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from recon_dagster.db.ledger import parse_marker
from recon_dagster.db.spend import Charge
from recon_dagster.providers.upstream_tasks import UpstreamTask

# The most tasks or jobs one report names (the figures always count all of them).
NAMED_MAX = 50


@dataclass(frozen=True)
class Finding:
    """One task, request or job behind a difference."""

    what: str  # e.g. spend_nobody_charged, charged_without_task
    subject: str  # a task id, request id or job id
    amount: float  # in the report's unit
    detail: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"what": self.what, "id": self.subject, "amount": self.amount, **self.detail}


@dataclass(frozen=True)
class SpendReport:
    provider: str
    unit: str  # seconds | characters | tokens | credits
    provider_amount: float
    our_amount: float
    tolerance: float
    findings: tuple[Finding, ...] = ()
    final: bool = True
    configured: bool = True
    note: str = ""
    our_cost_usd: float = 0.0
    breakdown: Mapping[str, float] = field(default_factory=dict)
    # The part of the difference the check judges (defaults to provider - ours).
    judged: float | None = None

    @property
    def difference(self) -> float:
        return self.provider_amount - self.our_amount

    @property
    def judged_difference(self) -> float:
        return self.difference if self.judged is None else self.judged

    @property
    def beyond_tolerance(self) -> bool:
        over = abs(self.judged_difference) > self.tolerance
        return over or any(f.what in ALWAYS_FAIL for f in self.findings)

    @property
    def passed(self) -> bool:
        """Green unless final and beyond tolerance (an unconfigured or provisional report is
        never red)."""
        return not (self.configured and self.final and self.beyond_tolerance)

    def named(self, what: str | None = None) -> list[dict[str, Any]]:
        chosen = [f for f in self.findings if what is None or f.what == what]
        return [f.as_dict() for f in chosen[:NAMED_MAX]]

    def line(self) -> str:
        """One line for the check's description and the run log."""
        if not self.configured:
            return f"{self.provider}: not configured ({self.note})"
        kinds: dict[str, int] = defaultdict(int)
        for f in self.findings:
            kinds[f.what] += 1
        found = ", ".join(f"{n} {what}" for what, n in sorted(kinds.items())) or "nothing unmatched"
        state = "" if self.final else "provisional (the provider's report is not final yet); "
        return (
            f"{self.provider}: {state}provider {self.provider_amount:g} {self.unit}, ours "
            f"{self.our_amount:g}, judged difference {self.judged_difference:g} "
            f"(tolerance {self.tolerance:g}); {found}"
        )


# Findings that fail the check whatever the tolerance: money taken for work that never ran.
ALWAYS_FAIL = frozenset({"charged_without_task"})


def charged_cost(charges: Iterable[Charge]) -> float:
    return float(sum((c.cost_usd or Decimal(0)) for c in charges if c.charged))


# --- Replicate: listed tasks against the ledger and the charges ------------------------------------


def billed_seconds(task: UpstreamTask) -> float:
    """What Replicate bills a task for: its ``predict_time`` (a training's ``total_time`` when it
    reports no predict time)."""
    for key in ("predict_time", "total_time"):
        value = task.metrics.get(key)
        if isinstance(value, int | float) and value == value and value > 0:
            return float(value)
    return 0.0


def match_replicate(
    tasks: Sequence[UpstreamTask],
    owners: Mapping[str, uuid.UUID],
    charges: Sequence[Charge],
    *,
    start: datetime,
    end: datetime,
    tolerance_s: float,
) -> SpendReport:
    """Replicate's tasks created in ``[start, end)`` (``tasks`` may reach past both ends: those
    are only looked at to find a charged job's task) against the charges of the period.

    ``owners`` is the ledger's job of each task id it holds. A task is paid for when its job's
    charge is committed and it is the task the job's row names (or, with no task on the row, the
    job's one task in the ledger); any other billed task is spend nobody charged: unknown (no
    ledger row, no marker), an orphan (its job was charged for another task), or refunded. A
    committed charge none of whose task ids was listed is a job charged without a task."""
    by_job = paying_charges(charges)
    listed = {t.task_id for t in tasks}
    job_of = {t.task_id: _owner(t, owners) for t in tasks}
    jobs_listed = {job for job in job_of.values() if job is not None}
    findings: list[Finding] = []
    seconds_by_model: dict[str, float] = defaultdict(float)
    billed = unpaid = 0.0
    for task in sorted(tasks, key=lambda t: t.task_id):
        if task.created_at is None or not start <= task.created_at < end:
            continue
        seconds = billed_seconds(task)
        billed += seconds
        model = task.model or "unknown"
        seconds_by_model[model] += seconds
        job = job_of[task.task_id]
        reason = _unpaid_reason(task.task_id, by_job.get(job) if job else None, job)
        if reason is None or seconds <= 0:
            continue
        unpaid += seconds
        detail: dict[str, Any] = {
            "reason": reason,
            "model": model,
            "collection": task.collection,
            "status": task.status,
        }
        if job is not None:
            detail["job_id"] = str(job)
        findings.append(Finding("spend_nobody_charged", task.task_id, seconds, detail))
    for charge in sorted(charges, key=lambda c: str(c.job_id)):
        in_period = start <= charge.created_at < end
        ran = bool(charge.task_ids & listed) or charge.job_id in jobs_listed
        if in_period and charge.charged and not ran:
            detail = {
                "provider_kind": charge.provider_kind,
                "task_ids": sorted(charge.task_ids),
            }
            findings.append(Finding("charged_without_task", str(charge.job_id), float(charge.amount), detail))
    paid = billed - unpaid
    return SpendReport(
        provider="replicate",
        unit="seconds",
        provider_amount=round(billed, 3),
        our_amount=round(paid, 3),
        tolerance=tolerance_s,
        findings=tuple(findings),
        our_cost_usd=charged_cost(c for c in charges if start <= c.created_at < end),
        breakdown={m: round(s, 3) for m, s in sorted(seconds_by_model.items())},
    )


def paying_charges(charges: Iterable[Charge]) -> dict[uuid.UUID, Charge]:
    """The charge that stands for each job: a committed one when any is (a job reserved twice
    and settled once has its oldest charge committed and the rest refunded, in any order), else
    its latest."""
    out: dict[uuid.UUID, Charge] = {}
    for c in sorted(charges, key=lambda c: c.created_at):
        if c.job_id not in out or not out[c.job_id].charged:
            out[c.job_id] = c
    return out


def _owner(task: UpstreamTask, owners: Mapping[str, uuid.UUID]) -> uuid.UUID | None:
    """The job of a listed task: the ledger's, else the job its marker names."""
    job = owners.get(task.task_id)
    if job is None and task.marker:
        parsed = parse_marker(task.marker)
        job = parsed[0] if parsed else None
    return job


def _unpaid_reason(task_id: str, charge: Charge | None, job: uuid.UUID | None) -> str | None:
    """Why a billed task is paid by nobody, or None when its job's charge pays for it."""
    if job is None:
        return "unknown"  # neither in the ledger nor marked: another system's, or a lost create
    if charge is None:
        return "no_charge"
    if not charge.charged:
        return charge.status  # reserved (still in flight) or refunded
    if charge.row_task_id is not None:
        return None if charge.row_task_id == task_id else "orphan"
    if charge.ledger_task_ids and charge.ledger_task_ids[-1] != task_id:
        return "orphan"
    return None


# --- KIE: the credit balance's change against the credits our KIE jobs took -------------------------


def match_kie(
    previous_balance: float | None,
    balance: float,
    charges: Sequence[Charge],
    creates_without_charge: Sequence[tuple[str, uuid.UUID]] = (),
    *,
    tolerance_credits: float,
) -> SpendReport:
    """KIE's balance went from ``previous_balance`` to ``balance`` between two samples; our KIE
    jobs of that window recorded ``metadata.provider_credits`` each. A refunded job's task failed
    upstream, which KIE does not bill, so it is not counted; a job in flight already paid KIE.
    ``creates_without_charge`` are the ledger's KIE tasks of the window whose job has no charge
    (named: they are what KIE billed that nobody charged)."""
    counted = [c for c in charges if c.status != "refunded"]
    ours = sum(c.number("provider_credits") or 0.0 for c in counted)
    findings = [
        Finding("task_without_charge", task_id, 0.0, {"job_id": str(job)})
        for task_id, job in creates_without_charge
    ]
    findings += [
        Finding("no_credits_recorded", str(c.job_id), float(c.amount), {"provider_kind": c.provider_kind})
        for c in counted
        if c.number("provider_credits") is None
    ]
    if previous_balance is None:
        return SpendReport(
            provider="kie", unit="credits", provider_amount=0.0, our_amount=round(ours, 4),
            tolerance=tolerance_credits, findings=tuple(findings), final=False,
            note="first balance sample: the next one judges the change", our_cost_usd=charged_cost(charges),
            breakdown={"balance": balance},
        )  # fmt: skip
    spent = previous_balance - balance
    return SpendReport(
        provider="kie",
        unit="credits",
        provider_amount=round(spent, 4),
        our_amount=round(ours, 4),
        tolerance=tolerance_credits,
        findings=tuple(findings),
        our_cost_usd=charged_cost(charges),
        breakdown={"balance": balance, "previous_balance": previous_balance},
        note="a top-up between the samples shows as negative spend" if spent < 0 else "",
    )
