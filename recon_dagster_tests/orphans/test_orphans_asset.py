"""``upstream_orphans`` and its check ``no_orphaned_upstream_work``, materialized through Dagster
against the sandbox and PostgreSQL: red while a task of ours runs that nobody cancelled, WARN for a
newly found billed orphan, green once the sweep has cancelled what it could."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.config import Settings
from recon_dagster.db import ledger
from recon_dagster.defs.orphans.sweep import upstream_orphans
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.providers import ProvidersResource, providers_from_env
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.factories import make_job
from recon_dagster_tests.support.orphans import recorded


@pytest.fixture
def providers(sandbox: SandboxServer) -> Iterator[ProvidersResource]:
    sandbox.reset()
    with contextlib.closing(providers_from_env()) as res:
        yield res


def check_of(providers: ProvidersResource, instance: dg.DagsterInstance) -> dg.AssetCheckEvaluation:
    result = dg.materialize(
        [upstream_orphans],
        resources={"database": DatabaseResource(), "providers": providers},
        instance=instance,
    )
    assert result.success
    [evaluation] = result.get_asset_check_evaluations()
    return evaluation


def test_the_check_is_red_in_shadow_and_green_once_enforce_cancelled(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    task = sandbox.add_task("replicate-prediction", Scenario(outcome="run_forever"))
    recorded(db, make_job(db, user, status="failed"), "replicate-prediction", task)
    monkeypatch.setenv(Settings.mode.name, "shadow")

    shadowed = check_of(providers, instance)
    monkeypatch.setenv(Settings.mode.name, "enforce")
    enforced = check_of(providers, instance)

    assert (shadowed.passed, shadowed.severity) == (False, dg.AssetCheckSeverity.ERROR)
    assert task in (shadowed.description or "")
    assert enforced.passed
    assert sandbox.task_info(task)["canceled"] is True


def test_a_newly_billed_orphan_warns_once(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance,
) -> None:  # fmt: skip
    task = sandbox.add_task("replicate-prediction", Scenario(polls_before_done=0))
    recorded(db, make_job(db, user, status="failed"), "replicate-prediction", task)

    first, second = check_of(providers, instance), check_of(providers, instance)

    assert (first.passed, first.severity) == (False, dg.AssetCheckSeverity.WARN)
    assert "predict_time" in (first.description or "")
    assert second.passed


def test_the_check_stays_red_while_a_task_that_could_not_be_cancelled_still_runs(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance,
) -> None:  # fmt: skip
    task = sandbox.add_task("kie-standard", Scenario(outcome="run_forever"))  # KIE has no cancel
    recorded(db, make_job(db, user, status="failed", provider_kind="kie-standard"), "kie-standard", task)

    first, second = check_of(providers, instance), check_of(providers, instance)

    assert (first.passed, first.severity) == (False, dg.AssetCheckSeverity.ERROR)
    assert (second.passed, second.severity) == (False, dg.AssetCheckSeverity.ERROR)  # still followed
    assert task in (second.description or "")


def test_a_probably_ours_task_warns_and_names_the_job_it_resembles(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance,
) -> None:  # fmt: skip
    asked = {"prompt": "a lighthouse"}
    job = make_job(db, user, status="failed")
    with db.begin() as conn:
        intent = ledger.record_intent(conn, job, provider="replicate", kind="replicate-prediction",
                                      fingerprint=ledger.fingerprint({"input": asked}), marker_sent=True)  # fmt: skip
        ledger.record_outcome(conn, intent.id, ledger.CreateState.AMBIGUOUS, "answer lost")
    task = sandbox.sandbox.state.add_task(
        "replicate-prediction", Scenario(outcome="run_forever"), input=asked
    )

    evaluation = check_of(providers, instance)

    assert (evaluation.passed, evaluation.severity) == (False, dg.AssetCheckSeverity.WARN)
    assert task.task_id in (evaluation.description or "") and str(job) in (evaluation.description or "")
    assert sandbox.task_info(task.task_id)["canceled"] is False
