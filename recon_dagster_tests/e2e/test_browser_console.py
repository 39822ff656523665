"""The operator's console during a Replicate outage (run tags, severity, stuck jobs, actions), in
headless Chromium against ``recon-dagster dev``.

The scenario: 30 Replicate jobs whose polls get HTTP 503, an ElevenLabs job running past attempt
17, five KIE jobs that succeeded upstream, two jobs the user cancelled, one leaked reservation.
The daemon reconciles; the tests look at what an on-call engineer sees first (which provider is
down, the force-fail, a job found by its tag, the stuck jobs and the actions). Every page is
asserted on real content, so a blank page fails. Screenshots: ``.recon/screenshots/console-*.png``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.core.runtags import job_tag
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.e2e.test_browser import (
    Console,
    _free_port,
    _launch,
    _need_browser,
    chart_points,
    open_console,
)
from recon_dagster_tests.support.daemon import dagster_dev_process
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.harness import wait_for
from recon_dagster_tests.support.instance import dagster_home
from recon_dagster_tests.support.sandbox_process import sandbox_process

pytestmark = pytest.mark.browser


def _seed(engine: sa.Engine, sandbox: Any) -> dict[str, Any]:
    user = make_user(engine, sub=5000, topup=0)

    def job(kind: str, scenario: Scenario, job_type: str = "image", **kw: Any) -> uuid.UUID:
        task = sandbox.add_task(kind, scenario)
        j = make_job(engine, user, job_type=job_type, provider_kind=kind, provider_task_id=task, **kw)
        reserve(engine, j, user, 10)
        return j

    replicate = [
        job("replicate-prediction", Scenario(server_error_first=10_000), started_minutes_ago=30)
        for _ in range(30)
    ]
    eleven = job(
        "elevenlabs-async",
        Scenario(outcome="run_forever"),
        job_type="audio",
        started_minutes_ago=90,
        reconcile_attempts=17,
    )
    kie = [job("kie-standard", Scenario(polls_before_done=0), started_minutes_ago=30) for _ in range(5)]
    cancelled = [make_job(engine, user, status="cancelled", provider_kind="kie-standard") for _ in range(2)]
    leaked = make_job(engine, user, status="failed", provider_kind="kie-standard", provider_task_id="gone")
    reserve(engine, leaked, user, 7)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET updated_at = now() - interval '30 minutes' WHERE id = :j"),
            {"j": str(leaked)},
        )
    return {"replicate": replicate, "eleven": eleven, "kie": kie, "cancelled": cancelled, "leaked": leaked}


def _worked(engine: sa.Engine, ids: list[uuid.UUID]) -> bool:
    with engine.connect() as conn:
        n = conn.execute(
            sa.text(
                "SELECT count(DISTINCT job_id) FROM reconcile_events WHERE job_id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": [str(i) for i in ids]},
        ).scalar_one()
    return n == len(ids)


@pytest.fixture(scope="module")
def outage(engine: sa.Engine, database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    _need_browser()
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "TRUNCATE jobs, usage_logs, user_credits, assets, workflow_executions, credit_anomalies, "
            "characters, reconcile_events RESTART IDENTITY CASCADE"
        )
    port = _free_port()
    with sandbox_process() as sandbox, dagster_home(database_url) as home:
        seeded = _seed(engine, sandbox)
        env = {
            **sandbox.env,
            "RECON_DATABASE_URL": database_url,
            "RECON_SENSOR_INTERVAL_S": "2",
            "RECON_MEDIA_DIR": str(tmp_path_factory.mktemp("media")),
        }
        (home.path / ".nux").mkdir()
        (home.path / ".nux" / "nux.yaml").write_text("seen: 1\n")
        with dagster_dev_process(home, env, port=port) as dev:
            everyone = [*seeded["replicate"], seeded["eleven"], *seeded["kie"]]
            wait_for(
                lambda: _worked(engine, everyone),
                timeout_s=240,
                what="the daemon",
                interval_s=1,
                logs=dev.log_tail,
            )
            health = _launch(dev.url, "reconcile_health_job")
            with home.instance() as instance:
                wait_for(
                    lambda: (r := instance.get_run_by_id(health)) is not None and r.is_finished,
                    timeout_s=150,
                    what="the health run",
                    interval_s=1,
                    logs=dev.log_tail,
                )
            yield {"url": dev.url, "seeded": seeded, "engine": engine}


@pytest.fixture(scope="module")
def console(outage: dict) -> Iterator[Console]:
    # Tall enough that the catalog, which renders only the rows in view, shows every asset of the
    # location (the spend and orphan assets put the health assets below a 900-pixel window).
    with open_console(outage["url"], 1400, 2000) as c:
        yield c


def test_1_which_provider_is_down_names_replicate_red_and_kie_green(console: Console):
    from playwright.sync_api import expect

    page = console.open("/assets/provider_health?view=checks", wait_text="provider_health")
    replicate = page.locator("[title='replicate']").first.locator("xpath=..")
    expect(replicate).to_contain_text("failed", ignore_case=True, timeout=60_000)
    kie = page.locator("[title='kie']").first.locator("xpath=..")
    expect(kie).not_to_contain_text("failed", ignore_case=True, timeout=10_000)
    replicate.click()
    page.get_by_text("replicate DOWN", exact=False).first.wait_for(timeout=60_000)
    console.shot("console-provider-health")


def test_2_the_force_fail_at_the_cap_shows_a_failed_check(console: Console, outage: dict):
    from playwright.sync_api import expect

    page = console.open("/assets/credit_anomalies?view=checks", wait_text="no_new_exhausted_jobs")
    item = page.locator("[title='no_new_exhausted_jobs']").first.locator("xpath=..")
    expect(item).to_contain_text("failed", ignore_case=True, timeout=60_000)
    console.shot("console-force-fail-check")


def test_3_a_job_id_finds_its_batch_run_in_one_filter(console: Console, outage: dict):
    job = outage["seeded"]["replicate"][7]
    key, value = job_tag(job)
    page = console.open(f"/runs?q%5B0%5D=tag%3A{key}%3D{value}", wait_text="reconcile_job")
    # The batch run that worked it, with its kind; the hidden per-job tags are not on the row.
    page.get_by_text("recon/provider_kind: replicate-prediction", exact=False).first.wait_for(timeout=30_000)
    assert "recon-job-" not in console.text().split("Duration")[-1]  # the rows, below the header
    console.shot("console-runs-by-job")


def test_4_stuck_jobs_lists_attempt_n_of_max(console: Console, outage: dict):
    # Dagster 1.13: the asset's Overview tab lists the latest metadata; the table is behind
    # "[Show Markdown]".
    page = console.open("/assets/stuck_jobs", wait_text="near_cap")
    page.get_by_text("[Show Markdown]", exact=False).first.click()
    page.get_by_text("/18", exact=False).first.wait_for(timeout=60_000)
    assert str(outage["seeded"]["replicate"][0])[:8] in console.text()
    console.shot("console-stuck-jobs")


def test_5_the_operator_actions_retry_and_fail_from_the_cli(outage: dict, database_url: str, monkeypatch):
    from recon_dagster.cli.commands import main
    from recon_dagster.operator.explain import explain, facts

    monkeypatch.setenv("RECON_DATABASE_URL", database_url)
    monkeypatch.setenv("RECON_OPERATOR", "oncall")
    retried, failed = outage["seeded"]["replicate"][1:3]
    assert main(["retry", str(retried), "--reason", "Replicate is back"]) == 0
    assert main(["fail", str(failed), "--reason", "user refund request"]) == 0
    assert main(["fail", str(outage["seeded"]["kie"][0]), "--reason", "late"]) == 1  # already completed
    story = dict(facts(explain(outage["engine"], None, failed)))
    assert story["status"].startswith("failed") and "refunded" in story["credits"]


def test_6_replicate_runs_carry_kind_and_provider_tags(console: Console):
    console.open("/runs?q%5B0%5D=tag%3Arecon%2Fprovider%3Dreplicate", wait_text="reconcile_job")
    assert "replicate-prediction" in console.text()
    console.shot("console-runs-replicate")


def test_7_the_catalog_lists_the_health_assets_and_the_outcome_series_plot_real_points(console: Console):
    console.open("/assets", wait_text="provider_health")
    assert "stuck_jobs" in console.text() and "outcomes_by_provider" in console.text()
    console.shot("console-catalog")
    # Not partitioned, so each point of a series is one reconcile run.
    assert console.outcome_plot("outcomes_by_provider/replicate", "replicate-prediction: errors (jobs)") >= 10
    text = console.text()
    assert "replicate-prediction: errors (jobs)" in text
    # Written by every run, and the asset's Automation section says so.
    assert (
        "written by every reconcile_job and sync_sweep_job run" in text and "No automations found" not in text
    )
    console.shot("console-outcome-plots")


def test_8_the_plot_check_fails_on_a_page_without_a_chart(console: Console):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    # Dagster 1.13's ?view=plots page renders no chart. The check of old (any canvas or svg)
    # passed on it: the navigation's icons are svgs.
    page = console.open("/assets/outcomes_by_provider/replicate?view=plots", wait_text="outcomes_by_provider")
    page.locator("canvas, svg").first.wait_for(timeout=10_000)
    with pytest.raises(PlaywrightTimeout):
        chart_points(page, timeout_ms=10_000)
    # No Anthropic job in this scenario: its series was never written, there is nothing to plot.
    with pytest.raises(PlaywrightTimeout):
        console.outcome_plot("outcomes_by_provider/anthropic", "outcomes_by_provider", timeout_ms=10_000)
