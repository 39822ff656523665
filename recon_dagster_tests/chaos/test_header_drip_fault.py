"""The header-drip row of the fault harness, fast mode: one round through the real CLI."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from recon_dagster_tests.chaos.headerdrip import run_header_drip
from recon_dagster_tests.support.sandbox_process import sandbox_process

pytestmark = pytest.mark.timeout(600)


def test_a_host_dripping_headers_holds_no_job_past_the_poll_deadline(
    engine: sa.Engine, database_url: str, tmp_path
) -> None:
    media = tmp_path / "media"
    media.mkdir()
    with sandbox_process(log_dir=tmp_path) as sandbox:
        report = run_header_drip(engine, database_url, sandbox, media, tmp_path, seed=7, jobs=4, rounds=1)
    assert report.trials == 4
    assert report.violations == 0, report.examples
    assert report.killed_at_point == 1  # every connection closed by the deadline + 2 s
