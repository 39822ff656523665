"""No window in which a DOWN provider reads as anything but down (issue 55, item 2), and the
outage shows where people look first (item 1).

The console shows a check's result only while Dagster counts it as one of the asset's latest
materialization (dagster-graphql's ``executionForLatestMaterialization``, through
``AssetCheckExecutionRecord.targets_latest_materialization``). A reconcile run finishing while a
health run is under way logs its evaluations between the health run's start and its
materialization: the test replays exactly that, at every health run of an outage, and reads each
check as the console does after every run.
"""

from __future__ import annotations

import asyncio

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._core.loader import LoadingContextForTest
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecord

import recon_dagster.defs.observe.health as health_defs
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick

HEALTH = dg.AssetKey("provider_health")


def _due_again(db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET reconcile_next_at = now() WHERE status IN ('pending', 'processing')")
        )


def console_reads(instance: dg.DagsterInstance, provider: str) -> str:
    """What the asset's Checks tab shows for ``provider``: failed, passed, or "not evaluated"."""

    async def read() -> str:
        ctx = LoadingContextForTest(instance)
        record = await AssetCheckExecutionRecord.gen(ctx, dg.AssetCheckKey(HEALTH, provider))
        if record is None or not await record.targets_latest_materialization(ctx):
            return "not evaluated"
        return (await record.resolve_status(ctx)).value.lower()

    return asyncio.run(read())


@pytest.mark.slow
def test_a_down_provider_reads_down_after_every_run_of_an_outage(
    db, instance, media_dir, sandbox, monkeypatch
):
    for _ in range(4):
        stale_job_with_task(
            db, sandbox, "replicate-prediction", Scenario(server_error_first=1000, outcome="run_forever")
        )
    for _ in range(2):
        stale_job_with_task(db, sandbox, "kie-standard", Scenario(outcome="run_forever"))
    defs = make_defs(media_dir, cadence_seconds=0, single_run_below=2)
    health_job = defs.resolve_job_def("provider_health_job")

    # Each health run judges while a reconcile run of the outage finishes beside it.
    real = health_defs.verdicts

    def judged_while_a_reconcile_run_ends(conn, policy):
        _due_again(db)
        tick(defs, instance)
        return real(conn, policy)

    monkeypatch.setattr(health_defs, "verdicts", judged_while_a_reconcile_run_ends)

    seen: list[tuple[str, str, str]] = []
    tick(defs, instance)
    seen.append(("reconcile", console_reads(instance, "replicate"), console_reads(instance, "kie")))
    for _ in range(3):
        result = health_job.execute_in_process(instance=instance, raise_on_error=False)
        seen.append(("health", console_reads(instance, "replicate"), console_reads(instance, "kie")))
        _due_again(db)
        tick(defs, instance)
        seen.append(("reconcile", console_reads(instance, "replicate"), console_reads(instance, "kie")))

    assert all(replicate == "failed" for _, replicate, _ in seen), seen
    assert all(kie == "succeeded" for _, _, kie in seen), seen
    # Item 1: while replicate is DOWN the health run fails, naming it, tagged as its outage.
    assert not result.success
    run = instance.get_run_by_id(result.run_id)
    assert run.tags["recon/outcome"] == "provider_outage" and run.tags["recon/provider"] == "replicate"
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert (
        "replicate DOWN: 4 of 4 job(s) got no answer"
        in failure.step_failure_data.user_failure_data.description
    )
