"""The conformance table (contract/scenarios.json) holds against the SQL functions and through the
Python worker library, on real PostgreSQL; every contract function is exercised by it."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.db import contract
from recon_dagster_tests.support.contract_scenarios import LibraryClient, SqlClient, load, play

SCENARIOS = load()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_the_scenario_holds_against_the_sql_functions(db: sa.Engine, scenario: dict[str, Any]) -> None:
    assert play(db, SqlClient(db), scenario) == []


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_the_scenario_holds_through_the_python_library(db: sa.Engine, scenario: dict[str, Any]) -> None:
    assert play(db, LibraryClient(db), scenario) == []


def test_every_contract_function_is_played_by_the_table() -> None:
    played = {step["call"] for s in SCENARIOS for step in s["steps"] if "call" in step}
    assert set(contract.FUNCTIONS) - {"create_task", "attach_task", "credit_anomaly"} <= played
    # create_answered is create_task then attach_task in one transaction (the library calls the
    # two); credit_anomaly is what attach_task writes (the late-task and duplicate scenarios).
    assert played <= set(contract.FUNCTIONS)


def test_a_scenario_that_expects_the_wrong_rows_is_caught(db: sa.Engine) -> None:
    """The runner fails a scenario whose expectations do not hold (it is not vacuous)."""
    [answered] = [s for s in SCENARIOS if s["name"] == "async create answered"]
    wrong = {**answered, "rows": {"jobs": {"job": {"provider_task_id": "another-task"}}}}
    assert play(db, SqlClient(db), wrong) == [
        "jobs[job].provider_task_id is 'task-1', expected 'another-task'"
    ]
