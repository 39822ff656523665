"""The spend matching rules, on their own (no database, no HTTP): every seeded difference is
reported exactly, by name, and nothing else is."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import dagster as dg
import pytest

from recon_dagster.config import Settings
from recon_dagster.db.ledger import marker_for
from recon_dagster.db.spend import Charge
from recon_dagster.defs.spend.assets import ANTHROPIC
from recon_dagster.defs.spend.schedules import days_to_reconcile, spend_reconciliation_schedule
from recon_dagster.defs.spend.summary import SUMMARY
from recon_dagster.providers.anthropic.spend import UsageBucket
from recon_dagster.providers.elevenlabs.spend import HistoryItem
from recon_dagster.providers.upstream_tasks import TaskPhase, UpstreamTask
from recon_dagster.reconcile.spend import match_kie, match_replicate
from recon_dagster.reconcile.spend_usage import (
    is_final,
    match_anthropic,
    match_elevenlabs,
)

DAY = datetime(2026, 11, 3, tzinfo=UTC)
END = DAY + timedelta(days=1)
NOON = DAY + timedelta(hours=12)


def task(
    task_id: str, seconds: float, *, at: datetime = NOON, model: str = "acme/flux", **more: Any
) -> UpstreamTask:
    return UpstreamTask(
        provider="replicate", task_id=task_id, collection="predictions", phase=TaskPhase.SUCCEEDED,
        status="succeeded", created_at=at, model=model, metrics={"predict_time": seconds}, **more,
    )  # fmt: skip


def charge(
    job: uuid.UUID, *, status: str = "committed", row: str | None = None, ledger: tuple[str, ...] = (),
    at: datetime = NOON, kind: str = "replicate-prediction", **meta: Any,
) -> Charge:  # fmt: skip
    return Charge(
        job_id=job, provider_kind=kind, status=status, amount=Decimal(5), cost_usd=Decimal("0.01"),
        created_at=at, row_task_id=row, ledger_task_ids=ledger, metadata=meta,
    )  # fmt: skip


def findings(report: Any) -> set[tuple[str, str]]:
    return {(f.what, f.subject) for f in report.findings}


def test_replicate_names_the_orphan_billed_the_unknown_task_and_the_job_charged_whose_task_never_ran() -> (
    None
):
    paid, orphaned, never_ran, refunded = (uuid.uuid4() for _ in range(4))
    tasks = [
        task("t-paid", 10.0),
        task("t-orphan", 4.0),  # the same job's first create: its row names t-paid2
        task("t-paid2", 3.0),
        task("t-unknown", 2.5),
        task("t-refunded", 1.0),
        task("t-yesterday", 50.0, at=DAY - timedelta(minutes=5)),  # outside the day: ignored
    ]
    owners = {"t-paid": paid, "t-orphan": orphaned, "t-paid2": orphaned, "t-refunded": refunded}
    charges = [
        charge(paid, row="t-paid", ledger=("t-paid",)),
        charge(orphaned, row="t-paid2", ledger=("t-orphan", "t-paid2")),
        charge(never_ran, row="t-ghost", ledger=("t-ghost",)),
        charge(refunded, status="refunded", row="t-refunded", ledger=("t-refunded",)),
    ]
    report = match_replicate(tasks, owners, charges, start=DAY, end=END, tolerance_s=0.0)

    assert findings(report) == {
        ("spend_nobody_charged", "t-orphan"),
        ("spend_nobody_charged", "t-unknown"),
        ("spend_nobody_charged", "t-refunded"),
        ("charged_without_task", str(never_ran)),
    }
    reasons = {f.subject: f.detail["reason"] for f in report.findings if f.what == "spend_nobody_charged"}
    assert reasons == {"t-orphan": "orphan", "t-unknown": "unknown", "t-refunded": "refunded"}
    assert (report.provider_amount, report.our_amount) == (20.5, 13.0)
    assert report.breakdown == {"acme/flux": 20.5}
    assert not report.passed


@pytest.mark.parametrize("tolerance, passed", [(7.4, False), (7.5, True), (100.0, True)])
def test_replicate_unpaid_seconds_fail_only_beyond_the_tolerance(tolerance: float, passed: bool) -> None:
    job = uuid.uuid4()
    tasks = [task("a", 5.0), task("b", 7.5)]
    report = match_replicate(
        tasks, {"a": job}, [charge(job, row="a")], start=DAY, end=END, tolerance_s=tolerance
    )
    assert report.judged_difference == 7.5
    assert report.passed is passed


def test_a_job_charged_without_a_task_fails_whatever_the_tolerance() -> None:
    job = uuid.uuid4()
    report = match_replicate([], {}, [charge(job, row="gone")], start=DAY, end=END, tolerance_s=1e9)
    assert findings(report) == {("charged_without_task", str(job))}
    assert not report.passed


def test_a_task_named_only_by_its_marker_is_its_jobs() -> None:
    job = uuid.uuid4()
    marked = task("t-marked", 2.0, marker=marker_for(job, 1))
    report = match_replicate([marked], {}, [charge(job)], start=DAY, end=END, tolerance_s=0.0)
    assert findings(report) == set()
    assert (report.provider_amount, report.our_amount) == (2.0, 2.0)


def test_a_charged_jobs_task_created_just_past_midnight_is_found_but_billed_to_the_next_day() -> None:
    job = uuid.uuid4()
    late = task("t-late", 2.0, at=END + timedelta(seconds=30))
    report = match_replicate(
        [late], {"t-late": job}, [charge(job, row="t-late", at=END - timedelta(seconds=1))],
        start=DAY, end=END, tolerance_s=0.0,
    )  # fmt: skip
    assert findings(report) == set()
    assert report.provider_amount == 0.0


def test_a_failed_or_still_queued_task_that_billed_nothing_is_no_difference() -> None:
    report = match_replicate([task("free", 0.0)], {}, [], start=DAY, end=END, tolerance_s=0.0)
    assert report.findings == () and report.passed


def test_elevenlabs_names_characters_nobody_charged_a_wrong_count_and_a_charge_history_never_saw() -> None:
    a, b, c = (uuid.uuid4() for _ in range(3))
    items = [
        HistoryItem("h1", "r1", 100, NOON),
        HistoryItem("h2", "r2", 40, NOON),
        HistoryItem("h3", "r3", 25, NOON),  # nobody's
    ]
    charges = [
        charge(a, kind="elevenlabs-sync", characters=100, request_id="r1"),
        charge(b, kind="elevenlabs-sync", characters=30, request_id="r2"),
        charge(c, kind="elevenlabs-sync", characters=12, request_id="r9"),
    ]
    report = match_elevenlabs(items, 165, charges, tolerance_chars=0)
    assert findings(report) == {
        ("characters_nobody_charged", "r3"),
        ("characters_differ", "r2"),
        ("charged_without_request", "r9"),
    }
    assert (report.provider_amount, report.our_amount, report.difference) == (165, 142, 23)
    assert not report.passed
    assert match_elevenlabs(items, 165, charges, tolerance_chars=23).judged_difference == 23


def test_anthropic_is_judged_only_once_its_report_is_final_and_never_without_a_key() -> None:
    job = uuid.uuid4()
    buckets = [
        UsageBucket(NOON, "claude-x", "apikey_1", 120, 30),
        UsageBucket(NOON + timedelta(hours=1), "claude-y", "apikey_1", 10, 0),
    ]
    charges = [charge(job, kind="anthropic-sync", model="claude-x", input_tokens=120, output_tokens=30)]
    final = match_anthropic(buckets, charges, final=True, tolerance_tokens=0)
    assert findings(final) == {("tokens_nobody_recorded", "claude-y")}
    assert (final.judged_difference, final.passed) == (10, False)
    provisional = match_anthropic(buckets, charges, final=False, tolerance_tokens=0)
    assert provisional.judged_difference == 10 and provisional.passed
    unconfigured = match_anthropic(None, charges, final=True, tolerance_tokens=0)
    assert not unconfigured.configured and unconfigured.passed and "not configured" in unconfigured.line()


def test_the_lag_window_ends_exactly_at_the_documented_delay() -> None:
    assert not is_final(END, END + timedelta(seconds=3599), 3600)
    assert is_final(END, END + timedelta(seconds=3600), 3600)


def test_kie_compares_the_balance_change_with_the_credits_our_live_jobs_took() -> None:
    live, failed, pending = (uuid.uuid4() for _ in range(3))
    charges = [
        charge(live, kind="kie-standard", provider_credits=12),
        charge(pending, kind="kie-standard", status="reserved", provider_credits=8),
        charge(failed, kind="kie-standard", status="refunded", provider_credits=30),
    ]
    orphan_job = uuid.uuid4()
    report = match_kie(1000, 970, charges, [("task-x", orphan_job)], tolerance_credits=5)
    assert (report.provider_amount, report.our_amount, report.difference) == (30, 20, 10)
    assert findings(report) == {("task_without_charge", "task-x")}
    assert not report.passed
    first = match_kie(None, 970, charges, tolerance_credits=0)
    assert not first.final and first.passed


@pytest.mark.parametrize(
    "at, delay_s, expected",
    [
        ("2026-11-03T01:00:00", 86_400, ("2026-11-02", "2026-11-01")),  # the default: a day later
        ("2026-11-03T01:00:00", 3600, ("2026-11-02", None)),  # final by the first run already
        ("2026-11-03T01:00:00", 3 * 86_400, ("2026-11-02", "2026-10-30")),
    ],
)
def test_the_daily_schedule_asks_for_yesterday_and_the_day_anthropic_just_finalised(
    at: str, delay_s: float, expected: tuple[str, str | None]
) -> None:
    yesterday, final_day = days_to_reconcile(datetime.fromisoformat(at).replace(tzinfo=UTC), delay_s)
    assert (yesterday.isoformat(), final_day.isoformat() if final_day else None) == expected


def test_the_daily_schedule_runs_every_provider_for_yesterday_and_anthropic_again_for_the_final_day(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(Settings.spend_anthropic_final_after_s.name, raising=False)
    context = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 11, 3, 1, tzinfo=UTC))
    requests = list(spend_reconciliation_schedule(context))  # type: ignore[arg-type]
    assert [(r.run_key, r.partition_key) for r in requests] == [
        ("2026-11-02", "2026-11-02"),
        ("2026-11-01/anthropic-final", "2026-11-01"),
    ]
    assert requests[0].asset_selection is None
    assert set(requests[1].asset_selection or ()) == {ANTHROPIC, SUMMARY}
