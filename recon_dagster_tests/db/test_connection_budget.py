"""``RECON_DB_MAX_CONNECTIONS``: one budget for every connection recon_dagster holds on the app's
database. A run worker takes its share of it before the run touches the database, other processes
take theirs, and an instance whose run queue would let more runs start than the budget has
connections for is refused, by the sensor and by every run, with one line saying what to set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml

from recon_dagster.db import budget
from recon_dagster.db import engine as engine_mod
from recon_dagster.defs.resources import ConnectionBudgetError, DatabaseResource, runs_at_once
from recon_dagster_tests.support.reconcile import evaluate_sensor, make_defs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def unpinned() -> Iterator[None]:
    """This process as a deployment's would be: its pool share not pinned by the test harness."""
    saved = (engine_mod._pool_limit, engine_mod._pool_pinned)
    engine_mod._pool_limit, engine_mod._pool_pinned = None, False
    engine_mod.dispose_engines()
    try:
        yield
    finally:
        engine_mod.dispose_engines()
        engine_mod._pool_limit, engine_mod._pool_pinned = saved


@pytest.mark.parametrize(("total", "runs"), [(6, 1), (20, 8), (30, 13), (31, 13), (32, 14), (100, 48)])
def test_the_budget_has_room_for_the_code_server_an_operator_command_and_its_runs(
    total: int, runs: int
) -> None:
    assert budget.most_runs_at_once(total) == runs
    assert budget.check_run_queue(runs, total) is None
    assert budget.check_run_queue(runs + 1, total) is not None
    assert budget.budget_for_runs(runs) <= total < budget.budget_for_runs(runs + 1)
    # Every run at its share, the code server and one more run's worth (an operator command) fit.
    share = budget.run_connections(runs, concurrency=16, total=total)
    assert share >= budget.MIN_RUN_CONNECTIONS
    assert budget.CODE_SERVER_CONNECTIONS + (runs + 1) * share <= total


@pytest.mark.parametrize("runs", [1, 3, 13, 40])
@pytest.mark.parametrize("total", [6, 20, 30, 200, 5000])
def test_a_run_never_holds_more_than_its_share_or_than_its_threads_can_use(runs: int, total: int) -> None:
    if budget.check_run_queue(runs, total):
        return
    for concurrency in (1, 4, 16, 64):
        share = budget.run_connections(runs, concurrency, total)
        assert budget.CODE_SERVER_CONNECTIONS + (runs + 1) * share <= total
        assert share <= max(budget.MIN_RUN_CONNECTIONS, concurrency + budget.RUN_THREADS_BEYOND_CONCURRENCY)


def test_a_queue_the_budget_cannot_hold_is_refused_with_what_to_set() -> None:
    said = budget.check_run_queue(13, total=20)
    assert said == (
        "RECON_DB_MAX_CONNECTIONS=20 has connections for 8 runs at once (2 each, 2 for the code server, "
        "one operator command), but dagster.yaml's run_queue.max_concurrent_runs is 13: lower it to 8, "
        "or raise RECON_DB_MAX_CONNECTIONS to 30"
    )
    unlimited = budget.check_run_queue(None, total=20)
    assert unlimited is not None and "does not limit its runs" in unlimited and "at most 8" in unlimited
    assert budget.check_run_queue(-1, total=20) == unlimited


def test_the_shipped_queue_follows_the_default_budget() -> None:
    shipped = yaml.safe_load((ROOT / "dagster.yaml").read_text())["run_queue"]["max_concurrent_runs"]
    assert budget.check_run_queue(shipped) is None
    assert shipped == budget.most_runs_at_once(budget.budget())  # the default budget is what it needs


def _probe_job() -> dg.JobDefinition:
    @dg.op
    def probe(database: DatabaseResource) -> str:
        pool = database.get_engine().pool
        return f"pool={pool.size()} overflow={pool._max_overflow}"  # type: ignore[attr-defined]

    @dg.job(resource_defs={"database": DatabaseResource()})
    def probe_job() -> None:
        probe()

    return probe_job


def test_a_run_takes_its_share_of_the_budget_before_it_touches_the_database(
    unpinned: None, engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECON_DB_MAX_CONNECTIONS", "20")
    with dg.instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 5}}) as instance:
        assert runs_at_once(instance) == 5
        result = _probe_job().execute_in_process(instance=instance)
    assert result.success
    assert result.output_for_node("probe") == "pool=3 overflow=0"  # (20 - 2) // (5 + 1)
    assert engine_mod.pool_limit() == 3


def test_a_run_under_a_queue_the_budget_cannot_hold_fails_before_any_connection(
    unpinned: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECON_DB_MAX_CONNECTIONS", "20")
    monkeypatch.setenv("RECON_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")  # never reached
    with (
        dg.instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 13}}) as instance,
        pytest.raises(dg.DagsterResourceFunctionError) as caught,
    ):
        _probe_job().execute_in_process(instance=instance)
    cause = caught.value.__cause__
    assert isinstance(cause, ConnectionBudgetError)
    assert "lower it to 8, or raise RECON_DB_MAX_CONNECTIONS to 30" in str(cause)
    assert engine_mod.pool_limit() == budget.OTHER_PROCESS_CONNECTIONS  # untouched


def test_the_sensor_refuses_to_request_runs_the_budget_cannot_hold(
    db, sandbox, media_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECON_DB_MAX_CONNECTIONS", "20")
    defs = make_defs(media_dir)
    with (
        dg.instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 13}}) as instance,
        pytest.raises(dg.DagsterResourceFunctionError) as caught,
    ):
        evaluate_sensor(defs, instance)
    assert isinstance(caught.value.__cause__, ConnectionBudgetError)
    assert "lower it to 8, or raise RECON_DB_MAX_CONNECTIONS to 30" in str(caught.value.__cause__)
    with dg.instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 8}}) as instance:
        evaluate_sensor(defs, instance)  # fits: the tick runs


def test_other_processes_hold_two_and_behind_a_pooler_never_prepare(
    unpinned: None, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = engine_mod.get_engine(database_url)
    assert (eng.pool.size(), eng.pool._max_overflow) == (2, 0)  # type: ignore[attr-defined]
    with eng.connect() as conn:
        assert conn.connection.driver_connection.prepare_threshold == 5  # psycopg's default
    engine_mod.dispose_engines()
    monkeypatch.setenv("RECON_DB_TRANSACTION_POOLER", "1")
    with engine_mod.get_engine(database_url).connect() as conn:
        assert conn.connection.driver_connection.prepare_threshold is None


def test_in_process_execution_on_an_ephemeral_instance_has_no_queue_to_hold_to(
    unpinned: None, engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # materialize / execute_in_process without an instance: no daemon launches runs there.
    monkeypatch.setenv("RECON_DB_MAX_CONNECTIONS", "20")
    result = _probe_job().execute_in_process()
    assert result.success
    assert result.output_for_node("probe") == "pool=2 overflow=0"  # this process's own share


def test_every_run_of_the_definitions_is_one_process(tmp_path: Path, provider_keys: None) -> None:
    """The budget gives each run worker one share: a run whose steps each got a process of their
    own (Dagster's default multiprocess executor) held a share per step. Every job, the implicit
    one the UI and backfills materialize assets through included, runs its steps in its process."""
    defs = make_defs(str(tmp_path))
    jobs = list(defs.resolve_all_job_defs())
    assert {"spend_reconciliation_job", "orphan_sweep_job", "reconcile_job"} <= {j.name for j in jobs}
    assert any(j.name.startswith("__ASSET_JOB") for j in jobs)
    several = {
        j.name: j.executor_def.name for j in jobs if j.executor_def.name != dg.in_process_executor.name
    }
    assert several == {}
