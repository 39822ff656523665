"""A paid job is never named unpaid: whatever order its charges come in (a job reserved twice and
settled once: the oldest committed, the rest refunded), and whenever its task was created within
the longest wait the settings allow before a create (``RECON_PRECALL_BUDGET_S``), across midnight
either way."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from recon_dagster.config import Settings
from recon_dagster.defs.spend.assets import replicate_spend
from recon_dagster.providers import ProvidersResource
from recon_dagster.reconcile.spend import match_replicate
from recon_dagster.sandbox import SandboxServer
from recon_dagster_tests.spend.test_spend_matching import DAY, END, NOON, charge, findings, task
from recon_dagster_tests.spend.test_spend_replicate_kie import PREDICTION, in_ledger, prediction, providers  # noqa: F401
from recon_dagster_tests.support.spend import charged_job, reconcile, resources, yesterday

STATUSES = st.sampled_from(["committed", "refunded", "reserved"])


@settings(max_examples=200, deadline=None)
@given(statuses=st.lists(STATUSES, min_size=1, max_size=4), order=st.randoms(use_true_random=False))
def test_a_job_is_paid_if_any_of_its_charges_was_committed(statuses: list[str], order) -> None:
    job = uuid.uuid4()
    charges = [
        charge(job, status=s, row="t-1", ledger=("t-1",), at=NOON + timedelta(minutes=i))
        for i, s in enumerate(statuses)
    ]
    order.shuffle(charges)
    report = match_replicate([task("t-1", 6.0)], {"t-1": job}, charges, start=DAY, end=END, tolerance_s=0.0)

    if "committed" in statuses:
        assert findings(report) == set() and report.our_amount == 6.0, statuses
        assert report.passed
    else:
        [finding] = report.findings
        assert finding.what == "spend_nobody_charged" and finding.subject == "t-1"
        # The reason is one of the job's own (never a committed job called refunded).
        assert finding.detail["reason"] in set(statuses), (statuses, finding.detail)


def _at(
    db: sa.Engine, sandbox: SandboxServer, job: uuid.UUID, task_id: str, charged: datetime, created: datetime
) -> None:
    """The job's charge taken at ``charged``, its task created upstream at ``created``."""
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE usage_logs SET created_at = :t WHERE job_id = :j"), {"t": charged, "j": str(job)}
        )
        conn.execute(
            sa.text("UPDATE upstream_creates SET intent_at = :t WHERE job_id = :j"),
            {"t": created, "j": str(job)},
        )
    upstream = sandbox.sandbox.state.get(task_id)
    assert upstream is not None
    upstream.created_at = created.timestamp()


@pytest.mark.parametrize("budget_s", [None, 5 * 3600.0])
def test_a_job_that_waited_past_midnight_before_its_create_is_paid_on_either_day(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,  # noqa: F811
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch, budget_s: float | None,
) -> None:  # fmt: skip
    """Charged at 23:00, created upstream at 01:59 the next day (2 h 59 min of waiting, inside
    the 3 h pre-call budget, and as long with a longer budget); and charged the day before at
    22:00, created as long after: neither day names a paid job as unpaid or a charge without its
    task."""
    if budget_s is not None:
        monkeypatch.setenv(Settings.precall_budget_s.name, str(budget_s))
    day = datetime.fromisoformat(yesterday()).replace(tzinfo=UTC)
    budget = budget_s if budget_s is not None else float(Settings.precall_budget_s.default)
    wait = timedelta(seconds=budget) - timedelta(minutes=1)
    seeded = []
    for charged in (day + timedelta(hours=23), day - timedelta(hours=2)):
        task_id = prediction(providers, sandbox, 5.0)
        job = charged_job(db, user, PREDICTION, task_id=task_id)
        in_ledger(db, job, "replicate", PREDICTION, task_id)
        _at(db, sandbox, job, task_id, charged, charged + wait)
        seeded.append((task_id, job))

    for partition in (yesterday(), (day - timedelta(days=1)).strftime("%Y-%m-%d")):
        done = reconcile(replicate_spend, instance, resources(providers, sandbox), partition)
        assert done.named() == set(), (partition, done.value("summary"))
        assert done.check.passed, done.value("summary")
