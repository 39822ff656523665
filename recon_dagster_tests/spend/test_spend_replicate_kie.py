"""Replicate's and KIE's spend reconciled on real PostgreSQL against the sandbox over HTTP, the
assets materialized in-process: an orphan billed, a task nobody knows, a job charged whose task
never ran, a KIE task billed that nobody charged; each reported exactly, by name."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.config import Settings
from recon_dagster.db import ledger
from recon_dagster.defs.spend.assets import kie_spend, replicate_spend
from recon_dagster.providers import ProvidersResource, providers_from_env
from recon_dagster.providers.kie.sandbox_spend import task_credits
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.spend import back_date, charged_job, reconcile, resources

PREDICTION = "replicate-prediction"


@pytest.fixture
def providers(sandbox: SandboxServer) -> Iterator[ProvidersResource]:
    sandbox.reset()
    sandbox.set_default_scenario(PREDICTION, Scenario(polls_before_done=0))
    sandbox.set_default_scenario("kie-standard", Scenario(polls_before_done=0))
    with contextlib.closing(providers_from_env()) as res:
        yield res


def prediction(providers: ProvidersResource, sandbox: SandboxServer, seconds: float) -> str:
    """A prediction created at the sandbox over HTTP, billed ``seconds`` of compute."""
    task_id = providers.replicate.create(PREDICTION, {"version": "v1", "input": {"prompt": "a fox"}})
    task = sandbox.sandbox.state.get(task_id)
    assert task is not None
    task.meta["predict_time"] = seconds
    return task_id


def in_ledger(db: sa.Engine, job: uuid.UUID, provider: str, kind: str, *task_ids: str) -> None:
    with db.begin() as conn:
        for task_id in task_ids:
            ledger.record_task(conn, job, provider=provider, kind=kind, task_id=task_id)


def seed_replicate_day(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID, *, ghost: bool
) -> dict[str, str]:
    paid = prediction(providers, sandbox, 7.0)
    job = charged_job(db, user, PREDICTION, task_id=paid)
    in_ledger(db, job, "replicate", PREDICTION, paid)
    # One job, two creates: the row names the second; the first ran and billed, nobody paid it.
    orphan, second = prediction(providers, sandbox, 4.0), prediction(providers, sandbox, 3.0)
    twice = charged_job(db, user, PREDICTION, task_id=second)
    in_ledger(db, twice, "replicate", PREDICTION, orphan, second)
    unknown = prediction(providers, sandbox, 2.5)  # another system's (no ledger row, no marker)
    seeded = {"orphan": orphan, "unknown": unknown}
    if ghost:
        never_ran = charged_job(db, user, PREDICTION, task_id="task-that-never-ran")
        in_ledger(db, never_ran, "replicate", PREDICTION, "task-that-never-ran")
        seeded["never_ran"] = str(never_ran)
    back_date(db, sandbox)
    return seeded


def test_replicate_reports_the_orphan_billed_the_unknown_task_and_the_job_charged_whose_task_never_ran(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance,
) -> None:  # fmt: skip
    seeded = seed_replicate_day(db, sandbox, providers, user, ghost=True)

    done = reconcile(replicate_spend, instance, resources(providers, sandbox))

    assert done.named() == {
        ("spend_nobody_charged", seeded["orphan"]),
        ("spend_nobody_charged", seeded["unknown"]),
        ("charged_without_task", seeded["never_ran"]),
    }
    reasons = {n["id"]: n.get("reason") for n in done.value("named")}
    assert reasons[seeded["orphan"]] == "orphan" and reasons[seeded["unknown"]] == "unknown"
    assert (done.value("provider_amount"), done.value("our_amount"), done.value("difference")) == (
        16.5,
        10.0,
        6.5,
    )
    assert done.value("breakdown/sandbox/model") == 16.5
    assert not done.check.passed
    assert seeded["never_ran"] in (done.check.description or "") or done.check.metadata["named"]


@pytest.mark.parametrize("tolerance, passed", [("6.4", False), ("6.5", True)])
def test_replicate_unpaid_seconds_pass_within_the_tolerance_setting(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch, tolerance: str, passed: bool,
) -> None:  # fmt: skip
    seed_replicate_day(db, sandbox, providers, user, ghost=False)
    monkeypatch.setenv(Settings.spend_replicate_tolerance_s.name, tolerance)

    done = reconcile(replicate_spend, instance, resources(providers, sandbox))

    assert done.value("difference") == 6.5
    assert done.check.passed is passed


def kie_task(providers: ProvidersResource) -> str:
    return providers.kie.create("kie-standard", {"model": "flux-test", "input": {"prompt": "a fox"}})


def test_kie_compares_the_balance_change_with_our_credits_and_names_the_task_nobody_charged(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    first = reconcile(kie_spend, instance, resources(providers, sandbox))
    assert first.check.passed and first.value("final") is False  # nothing to compare yet

    price = task_credits("kie-standard")
    paid = kie_task(providers)
    job = charged_job(db, user, "kie-standard", task_id=paid, provider_credits=price)
    in_ledger(db, job, "kie", "kie-standard", paid)
    # Its job was failed and refunded here, but the task succeeded upstream: KIE billed it.
    orphan = kie_task(providers)
    refunded = charged_job(
        db, user, "kie-standard", task_id=orphan, status="refunded", provider_credits=price
    )
    in_ledger(db, refunded, "kie", "kie-standard", orphan)
    # A task that failed upstream costs nothing at KIE and nothing here.
    failed = providers.kie.create(
        "kie-standard", {"model": "flux-test", "input": {}, "sandbox_scenario": {"outcome": "fail"}}
    )
    gone = charged_job(db, user, "kie-standard", task_id=failed, status="refunded", provider_credits=price)
    in_ledger(db, gone, "kie", "kie-standard", failed)
    with db.begin() as conn:
        [create] = ledger.creates_of_job(conn, gone)
        ledger.set_fate(conn, create.id, ledger.Fate.ENDED, {"status": "failed"})

    second = reconcile(kie_spend, instance, resources(providers, sandbox))

    assert (second.value("provider_amount"), second.value("our_amount")) == (2 * price, price)
    assert second.value("difference") == price
    assert second.named() == {("task_without_charge", orphan)}
    assert not second.check.passed

    monkeypatch.setenv(Settings.spend_kie_tolerance_credits.name, str(price))
    third = reconcile(kie_spend, instance, resources(providers, sandbox))
    assert third.value("provider_amount") == 0 and third.check.passed  # nothing moved since
