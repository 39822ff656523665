"""A force-failed job's upstream task is stopped, never left billing (issue 55, item 4).

The operator's ``fail`` and the attempt cap refund the user; a task still queued or running at the
provider is then cancelled where the provider can, or handed to the orphan sweep (fate
``handed_to_sweep``), which cancels it once the provider answers. On fal (a queue it cannot list:
the sweep polls the ledger's task) and on Replicate (predictions and trainings, listed), against
the loopback sandbox over HTTP, with a real PostgreSQL.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.cli.commands import main
from recon_dagster.core.kinds import MAX_ATTEMPTS
from recon_dagster.db import ledger
from recon_dagster.operator.actions import FAIL, OperatorError, fail_now
from recon_dagster.operator.explain import load_story, to_text
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.orphan_sweep import SweepPolicy, sweep_orphans
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import balances, job_row, make_user
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick, usage_status

pytestmark = pytest.mark.postgres

KINDS = ["fal-image", "fal-video", "replicate-prediction", "replicate-training"]
SWEEP = SweepPolicy(window=timedelta(hours=6), grace=timedelta(0), act=True, shadowed=lambda kind: False)


def _running(db, sandbox, kind: str, scenario: Scenario | None = None, attempts: int = 0):
    user = make_user(db, sub=100, topup=0)
    _, job, task = stale_job_with_task(
        db, sandbox, kind, scenario or Scenario(outcome="run_forever"), minutes=600, attempts=attempts,
        user=user, credits=10, job_type="lora-training" if kind == "replicate-training" else "image",
    )  # fmt: skip
    return user, job, task


def _fate(db, task: str) -> str | None:
    with db.connect() as conn:
        return conn.execute(
            sa.text("SELECT fate FROM upstream_creates WHERE task_id = :t"), {"t": task}
        ).scalar_one_or_none()


def _exhausted_detail(db, job) -> str:
    with db.connect() as conn:
        return str(
            conn.execute(
                sa.text("SELECT detail FROM reconcile_events WHERE job_id = :j AND outcome = 'exhausted'"),
                {"j": str(job)},
            ).scalar_one()
        )


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unreachable(providers: Any, kind: str) -> Any:
    """``providers`` with ``kind``'s provider pointed at a closed loopback port (down: refused)."""
    name = "fal" if kind.startswith("fal") else "replicate"
    resource = getattr(providers, name)
    dead = resource.model_copy(update={"base_url": f"http://127.0.0.1:{_dead_port()}/{name}"})
    return providers.model_copy(update={name: dead})


def _recover(sandbox, task: str) -> None:
    """The provider answers this task's requests again (its injected 5xx stop)."""
    sandbox.sandbox.state.get(task).scenario.server_error_first = 0


@pytest.mark.parametrize("kind", KINDS)
def test_an_operator_fail_cancels_the_running_task_where_the_provider_can(db, sandbox, kind):
    user, job, task = _running(db, sandbox, kind)
    providers = providers_from_env()

    done = fail_now(db, job, who="bob", reason="user asked", providers=providers)

    assert sandbox.task_info(task)["canceled"] is True
    assert f"upstream task {task} at {kind.split('-')[0]} cancelled" in done.line
    assert job_row(db, job)["status"] == "failed" and usage_status(db, job) == "refunded"
    assert balances(db, user) == (Decimal(100), Decimal(0))
    assert _fate(db, task) == ledger.Fate.CANCELLED
    story = to_text(load_story(db, job), None)
    assert "cancelled" in story and task in story
    # The sweep finds nothing left to do: no second cancel, the fate stays.
    requests = sandbox.task_info(task)["requests"]
    report = sweep_orphans(db, providers, SWEEP)
    assert not [t for t in report.tasks if t.verdict.task.task_id == task and t.done.startswith("cancel")]
    assert _fate(db, task) == ledger.Fate.CANCELLED
    assert sandbox.task_info(task)["requests"] <= requests + 1  # at most a poll or list, never a cancel
    # A second fail is refused and cancels nothing more.
    with pytest.raises(OperatorError, match="already failed"):
        fail_now(db, job, who="bob", reason="again", providers=providers)


@pytest.mark.parametrize("kind", KINDS)
def test_a_fail_while_the_provider_is_down_hands_the_task_to_the_sweep_which_cancels_it(db, sandbox, kind):
    _, job, task = _running(db, sandbox, kind)

    done = fail_now(db, job, who="bob", reason="outage", providers=_unreachable(providers_from_env(), kind))

    assert "handed to the orphan sweep" in done.line and "did not answer the cancel" in done.line
    assert job_row(db, job)["status"] == "failed" and usage_status(db, job) == "refunded"
    assert sandbox.task_info(task)["canceled"] is False  # still running upstream...
    assert _fate(db, task) == ledger.Fate.HANDED_TO_SWEEP
    assert "handed_to_sweep" in to_text(load_story(db, job), None)
    # ... until the sweep, with the provider answering, cancels it.
    report = sweep_orphans(db, providers_from_env(), SWEEP)
    [swept] = [t for t in report.tasks if t.verdict.task.task_id == task]
    assert swept.done == "cancelled", swept
    assert sandbox.task_info(task)["canceled"] is True
    assert _fate(db, task) == ledger.Fate.CANCELLED


def test_a_fail_without_a_provider_client_or_a_cancel_is_handed_and_followed(db, sandbox):
    # KIE cannot cancel: its task is followed by the sweep until it ends.
    _, kie_job, kie_task = _running(db, sandbox, "kie-standard")
    done = fail_now(db, kie_job, who="bob", reason="dead", providers=providers_from_env())
    assert "kie cannot cancel it; handed to the orphan sweep" in done.line
    assert _fate(db, kie_task) == ledger.Fate.CANCEL_REFUSED
    # No provider client given (a caller without one): handed, the sweep cancels it.
    _, job, task = _running(db, sandbox, "fal-image")
    done = fail_now(db, job, who="bob", reason="dead")
    assert "handed to the orphan sweep" in done.line and sandbox.task_info(task)["canceled"] is False
    sweep_orphans(db, providers_from_env(), SWEEP)
    assert sandbox.task_info(task)["canceled"] is True


@pytest.mark.parametrize("kind", ["fal-image", "replicate-prediction"])
def test_the_cli_fail_cancels_upstream_and_says_so(db, sandbox, kind, capsys, monkeypatch, database_url):
    monkeypatch.setenv("RECON_DATABASE_URL", database_url)
    _, job, task = _running(db, sandbox, kind)

    assert main(["fail", str(job), "--reason", "stuck on a dead task"]) == 0

    assert "cancelled" in capsys.readouterr().out
    assert sandbox.task_info(task)["canceled"] is True


@pytest.mark.parametrize("kind", KINDS)
def test_the_cap_cancels_a_task_the_provider_says_still_runs(db, instance, media_dir, sandbox, kind):
    user, job, task = _running(db, sandbox, kind, attempts=MAX_ATTEMPTS - 1)

    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "failed" and usage_status(db, job) == "refunded"
    assert sandbox.task_info(task)["canceled"] is True
    assert _fate(db, task) == ledger.Fate.CANCELLED
    detail = _exhausted_detail(db, job)
    assert f"upstream task {task} at {kind.split('-')[0]} cancelled" in detail
    assert "cancelled" in to_text(load_story(db, job), None)


@pytest.mark.parametrize("kind", KINDS)
def test_the_cap_during_an_outage_hands_the_task_to_the_sweep_without_a_cancel(
    db, instance, media_dir, sandbox, kind
):
    _, job, task = _running(
        db, sandbox, kind, Scenario(outcome="run_forever", server_error_first=1_000_000), MAX_ATTEMPTS - 1
    )

    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "failed" and usage_status(db, job) == "refunded"
    assert sandbox.task_info(task)["canceled"] is False
    assert _fate(db, task) == ledger.Fate.HANDED_TO_SWEEP
    detail = _exhausted_detail(db, job)
    assert "handed to the orphan sweep" in detail and "did not answer its last poll" in detail
    # The provider answers again: the next sweep cancels it.
    _recover(sandbox, task)
    sweep_orphans(db, providers_from_env(), SWEEP)
    assert sandbox.task_info(task)["canceled"] is True
    assert _fate(db, task) == ledger.Fate.CANCELLED


def test_the_cap_leaves_alone_a_task_whose_own_result_ended_it(db, instance, media_dir, sandbox):
    """An unusable result (the task succeeded, its media is not what was promised) is no running task."""
    _, job, task = _running(
        db, sandbox, "fal-image", Scenario(polls_before_done=0, media_kind="text"), MAX_ATTEMPTS - 1
    )

    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "failed"
    assert _fate(db, task) is None and sandbox.task_info(task)["canceled"] is False


def test_a_fail_that_loses_to_a_settled_job_stops_nothing(db, sandbox):
    _, job, task = _running(db, sandbox, "replicate-prediction")
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET status = 'completed' WHERE id = :j"), {"j": str(job)})
    with pytest.raises(OperatorError, match="already completed"):
        fail_now(db, job, who="bob", reason="late", providers=providers_from_env())
    assert sandbox.task_info(task)["canceled"] is False and _fate(db, task) is None
    assert FAIL  # the outcome name stays the operator's
