"""The fault harness, fast mode: one SIGKILLed process per crash point (about 10 jobs each), one
recovery through ``recon-dagster reconcile --once``, then every job against the invariants.

The full run (200+ trials per point) is ``benchmarks/chaos.py``; both use ``harness.py``.
``RECON_CHAOS_SEED`` replays another seed; ``RECON_CHAOS_JOBS`` changes the jobs per round.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from recon_dagster_tests.chaos import checks, harness, worlds
from recon_dagster_tests.support.sandbox_process import sandbox_process

SEED = int(os.environ.get("RECON_CHAOS_SEED", "7"))
JOBS = int(os.environ.get("RECON_CHAOS_JOBS", "10"))
CASE_IDS = [f"{p}:{q}" for p, q in worlds.CASES]

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def campaign(
    engine: sa.Engine, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[harness.Campaign]:
    work = tmp_path_factory.mktemp("chaos")
    media = work / "media"
    media.mkdir()
    with sandbox_process(log_dir=work) as sandbox:
        yield harness.run_campaign(
            engine,
            database_url,
            sandbox,
            media,
            seed=SEED,
            jobs_per_round=JOBS,
            rounds_per_case=1,
            workdir=work,
        )


def _report(campaign: harness.Campaign, case: str) -> checks.PointReport:
    rep = campaign.reports[case]
    assert rep.trials == JOBS
    return rep


@pytest.mark.parametrize("case", [c for c in CASE_IDS if c.split(":", 1)[1] not in worlds.FAULTS])
def test_every_crash_point_is_reached_and_kills_the_process(campaign: harness.Campaign, case: str) -> None:
    """A harness that never crashed where it says proves nothing: every job parked at the point."""
    (result,) = [r for r in campaign.rounds if r.case == case]
    assert result.expected_hits > 0, f"seed {result.seed}: no job of the round reaches {case}"
    assert result.killed_at_point, result


@pytest.mark.parametrize("case", CASE_IDS)
def test_nothing_lost_nothing_settled_twice(campaign: harness.Campaign, case: str) -> None:
    rep = _report(campaign, case)
    assert rep.completed + rep.failed_refunded == rep.trials, rep.examples
    assert (rep.lost, rep.double_commits, rep.double_refunds, rep.mismatched) == (0, 0, 0, 0), rep.examples


@pytest.mark.parametrize("case", CASE_IDS)
def test_no_duplicate_upstream_creates(campaign: harness.Campaign, case: str) -> None:
    rep = _report(campaign, case)
    assert rep.duplicate_creates == 0, rep.examples


# A SIGKILL mid-download used to leave the folder store's .part file behind: the
# next write into the folder now removes parts whose writer is gone.
LEFTOVER_CASES = CASE_IDS


@pytest.mark.parametrize("case", LEFTOVER_CASES)
def test_no_media_left_for_jobs_that_did_not_complete(campaign: harness.Campaign, case: str) -> None:
    rep = _report(campaign, case)
    assert (rep.leftover_objects, rep.leftover_parts) == (0, 0), rep.examples


def test_report_table_has_a_row_per_point(campaign: harness.Campaign) -> None:
    table = harness.table(campaign)
    assert table.count("\n| `") == len(worlds.CASES)
    assert f"| {SEED} |" in table


def test_outage_round_really_failed_the_worker_mid_job(campaign: harness.Campaign) -> None:
    """The outage must leave work for recovery, or it tests nothing."""
    (result,) = [r for r in campaign.rounds if r.case == "worker:sandbox.outage"]
    assert result.returncode == 0 and not result.killed_by_harness
    assert result.inflight_after > 0, result
