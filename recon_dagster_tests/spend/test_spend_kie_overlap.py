"""KIE's spend is its balance change between two samples: ``kie_spend`` runs at once (a backfill
beside the schedule's run) each measure a window of their own, and together they count every
credit KIE took exactly once. Real runs (``dg.materialize`` on a persistent instance), real
PostgreSQL, KIE's sandbox over HTTP, each run in its own process; the runs are held together
after each has read the balance, so every one of them saw the same latest sample before any
wrote its own."""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Callable
from datetime import datetime
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.db import balance_samples
from recon_dagster.defs.spend.assets import kie_spend
from recon_dagster.providers import ProvidersResource
from recon_dagster.providers.kie.sandbox_spend import task_credits
from recon_dagster.providers.kie.spend import KieSpend
from recon_dagster.sandbox import SandboxServer
from recon_dagster_tests.spend.test_spend_replicate_kie import in_ledger, kie_task, providers  # noqa: F401
from recon_dagster_tests.support.spend import charged_job, reconcile, resources, yesterday


def _run_in_its_own_process(ref: object, partition: str, barrier: Any, out: Any) -> None:
    """One ``kie_spend`` run, in a process of its own (Dagster runs are not thread-safe beside each
    other in one process: their logging set-up deadlocks). Its first balance read waits for the
    other runs' before returning, so every run has read the chain's head and the balance before
    any of them writes its sample."""
    from recon_dagster.defs.resources import DatabaseResource
    from recon_dagster.providers import providers_from_env

    original: Callable[[KieSpend], float] = KieSpend.credit_balance
    calls = itertools.count()

    def together(self: KieSpend) -> float:
        value = original(self)
        if next(calls) == 0:
            barrier.wait()
        return value

    KieSpend.credit_balance = together  # type: ignore[method-assign]  # this child process only
    try:
        with dg.DagsterInstance.from_ref(ref) as instance:  # type: ignore[arg-type]
            res = {"providers": providers_from_env(), "database": DatabaseResource()}
            result = dg.materialize([kie_spend], partition_key=partition, instance=instance, resources=res)
            [materialization] = result.asset_materializations_for_node(kie_spend.op.name)
            [check] = result.get_asset_check_evaluations()
            meta = dict(materialization.metadata)
            figures = {
                k: getattr(meta[k], "value", meta[k]) if k in meta else None
                for k in ("provider_amount", "our_amount", "window", "sample")
            }
            out.put(
                {
                    "success": result.success,
                    **figures,
                    "passed": check.passed,
                    "description": check.description,
                }
            )
    except BaseException as exc:  # the parent is waiting on the queue: say what went wrong there
        out.put({"success": False, "error": repr(exc)})
        raise


def _at_once(instance: dg.DagsterInstance, runs: int) -> list[dict[str, Any]]:
    """``runs`` kie_spend runs at once, each in its own process on the same instance."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(runs, timeout=180), ctx.Queue()
    procs = [
        ctx.Process(target=_run_in_its_own_process, args=(instance.get_ref(), yesterday(), barrier, out))
        for _ in range(runs)
    ]
    for proc in procs:
        proc.start()
    try:
        done = [out.get(timeout=300) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    assert all(d["success"] for d in done), done
    return done


def _window(done: dict[str, Any]) -> tuple[datetime, datetime]:
    start, end = str(done["window"]).split(" .. ")
    return datetime.fromisoformat(start), datetime.fromisoformat(end)


@pytest.mark.parametrize("runs", [2, 3])
def test_kie_spend_runs_at_once_count_each_credit_once(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user, instance: dg.DagsterInstance,  # noqa: F811
    runs: int,
) -> None:  # fmt: skip
    res = resources(providers, sandbox)
    reconcile(kie_spend, instance, res)  # the first sample: the windows below start at it
    before = providers.kie.credit_balance()
    price = task_credits("kie-standard")
    for _ in range(2):
        paid = kie_task(providers)
        job = charged_job(db, user, "kie-standard", task_id=paid, provider_credits=price)
        in_ledger(db, job, "kie", "kie-standard", paid)
    spent = before - providers.kie.credit_balance()
    assert spent == 2 * price

    done = _at_once(instance, runs)

    # Together the runs saw KIE take what it took, and our charges, once each.
    assert sum(d["provider_amount"] for d in done) == spent
    assert sum(d["our_amount"] for d in done) == spent
    assert all(d["passed"] for d in done), [d["description"] for d in done]
    # Their windows follow each other without overlapping: each starts where another ended.
    windows = sorted(_window(d) for d in done)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(windows)), windows
    assert len({d["sample"] for d in done}) == runs
    # The chain: every sample measured from exactly one other, the latest is the last run's.
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(f"SELECT id, previous_id FROM {balance_samples.TABLE} WHERE provider = 'kie' ORDER BY id")
        ).all()
        head = balance_samples.latest(conn, "kie")
    assert [r.previous_id for r in rows] == [None, *(r.id for r in rows[:-1])]
    assert head is not None and head.sampled_at == max(w[1] for w in windows)


def test_a_second_sample_from_the_same_one_is_refused(db: sa.Engine) -> None:
    at = datetime.fromisoformat("2026-12-01T00:00:00+00:00")
    with db.begin() as conn:
        first = balance_samples.record(conn, "kie", 100.0, at, None)
        assert first is not None
        assert balance_samples.record(conn, "kie", 99.0, at, None) is None  # a second first one
        second = balance_samples.record(conn, "kie", 90.0, at, first)
        assert second is not None
        assert balance_samples.record(conn, "kie", 80.0, at, first) is None
        # Another provider's chain is its own.
        assert balance_samples.record(conn, "other", 5.0, at, None) is not None
        assert balance_samples.latest(conn, "kie") == second
