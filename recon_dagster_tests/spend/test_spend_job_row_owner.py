"""Spend and the job row as ownership (issue 46, item 5), on real PostgreSQL and the sandbox over
HTTP: a prediction the app recorded only on its job row (as the spec's contract asks, no create
ledger) is that job's, paid by its charge, never "unknown"."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.defs.spend.assets import replicate_spend
from recon_dagster.providers import ProvidersResource, providers_from_env
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.spend import back_date, charged_job, reconcile, resources

PREDICTION = "replicate-prediction"


@pytest.fixture
def providers(sandbox: SandboxServer) -> Iterator[ProvidersResource]:
    sandbox.reset()
    sandbox.set_default_scenario(PREDICTION, Scenario(polls_before_done=0))
    with contextlib.closing(providers_from_env()) as res:
        yield res


def test_a_prediction_only_its_job_row_names_is_paid_by_that_jobs_charge(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID,
    instance: dg.DagsterInstance,
) -> None:  # fmt: skip
    paid = providers.replicate.create(PREDICTION, {"version": "v1", "input": {"prompt": "a fox"}})
    stranger = providers.replicate.create(PREDICTION, {"version": "v1", "input": {"prompt": "a hen"}})
    for task_id in (paid, stranger):
        task = sandbox.sandbox.state.get(task_id)
        assert task is not None
        task.meta["predict_time"] = 5.0
    charged_job(db, user, PREDICTION, task_id=paid)  # the row names it; no ledger row at all
    back_date(db, sandbox)

    done = reconcile(replicate_spend, instance, resources(providers, sandbox))

    assert done.named() == {("spend_nobody_charged", stranger)}
    assert (done.value("provider_amount"), done.value("our_amount")) == (10.0, 5.0)
