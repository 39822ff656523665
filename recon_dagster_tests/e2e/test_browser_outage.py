"""Issue 55's on-call review, replayed in headless Chromium against ``recon-dagster dev``.

The scenario: ElevenLabs down (4 dubbing jobs whose polls get HTTP 500), Replicate degraded (3 of
its 10 predictions get HTTP 503, the rest answer "processing"), fal slow but answering (3 requests
whose polls take 1.5 s; ``RECON_HEALTH_SLOW_POLL_S=1``), one fal request at attempt 17 that is
force-failed and refunded at 18 while still queued upstream. The real daemon reconciles; the
alert sensor delivers to loopback Slack and PagerDuty receivers. The pages then show:

1. the outage where people look first: the health run fails while ElevenLabs is DOWN (Runs →
   Failed, ``recon/outcome: provider_outage``), Replicate's runs carry ``recon/outcome: degraded``;
2. provider_health: ElevenLabs failed, Replicate DEGRADED (a WARN failure, not green), fal "slow"
   but not down;
3. the force-fail says where its task was upstream ("at fal") and its incident counts the window;
4. every page (Slack, PagerDuty) carries its first step and runbook link;
5. stuck_jobs no longer lists the force-failed job and is a table with attempt n of max;
6. the force-fail at the cap cancelled its request at fal (it was still queued there), and
   stuck_jobs lists only the stuck: Replicate's unanswered predictions with why, not the ones whose
   polls on time say they still run (counted in running_fine).
7. a stuck row's story is one click away, on a job_story page that exists;
8. the Catalog leads with the recon_oncall group, the open incidents are an asset page (what,
   severity, first step, runbook), and the outcome plots are one per kind and figure, labelled with
   their unit, none for what never happened (no flat-zero panel).

Screenshots: ``.recon/screenshots/outage-*.png``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import MAX_ATTEMPTS
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.e2e.test_browser import Console, _free_port, _launch, _need_browser, open_console
from recon_dagster_tests.support.alert_receivers import ROUTING_KEY, alert_receivers
from recon_dagster_tests.support.daemon import dagster_dev_process
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.harness import wait_for
from recon_dagster_tests.support.instance import dagster_home
from recon_dagster_tests.support.sandbox_process import sandbox_process

pytestmark = pytest.mark.browser

RUNBOOKS = "https://docs.example/recon_dagster/docs/"


def _seed(engine: sa.Engine, sandbox: Any) -> dict[str, Any]:
    user = make_user(engine, sub=5000, topup=0)

    def job(kind: str, scenario: Scenario, job_type: str, **kw: Any) -> uuid.UUID:
        task = sandbox.add_task(kind, scenario)
        j = make_job(engine, user, job_type=job_type, provider_kind=kind, provider_task_id=task, **kw)
        reserve(engine, j, user, 10)
        return j

    forever = Scenario(outcome="run_forever")
    return {
        "eleven": [
            job("elevenlabs-async", Scenario(server_error_first=100_000), "audio", started_minutes_ago=30)
            for _ in range(4)
        ],
        "replicate_down": [
            job("replicate-prediction", Scenario(server_error_first=100_000), "image", started_minutes_ago=30)
            for _ in range(3)
        ],
        "replicate_up": [
            job("replicate-prediction", forever, "image", started_minutes_ago=30) for _ in range(7)
        ],
        "fal_slow": [
            job("fal-image", Scenario(outcome="run_forever", latency_s=1.5), "image", started_minutes_ago=30)
            for _ in range(3)
        ],
        "fal_cap": job(
            "fal-image", forever, "image", started_minutes_ago=60, reconcile_attempts=MAX_ATTEMPTS - 1
        ),
    }


def _worked(engine: sa.Engine, ids: list[uuid.UUID]) -> bool:
    with engine.connect() as conn:
        n = conn.execute(
            sa.text(
                "SELECT count(DISTINCT job_id) FROM reconcile_events WHERE job_id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": [str(i) for i in ids]},
        ).scalar_one()
    return int(n) == len(ids)


@pytest.fixture(scope="module")
def outage(engine: sa.Engine, database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    _need_browser()
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "TRUNCATE jobs, usage_logs, user_credits, assets, workflow_executions, credit_anomalies, "
            "characters, reconcile_events RESTART IDENTITY CASCADE"
        )
    port = _free_port()
    with sandbox_process() as sandbox, dagster_home(database_url) as home, alert_receivers() as receivers:
        seeded = _seed(engine, sandbox)
        env = {
            **sandbox.env,
            "RECON_DATABASE_URL": database_url,
            "RECON_SENSOR_INTERVAL_S": "2",
            "RECON_RECONCILE_CADENCE_S": "10",
            "RECON_SINGLE_RUN_BELOW": "3",
            "RECON_HEALTH_SLOW_POLL_S": "1",
            "RECON_MEDIA_DIR": str(tmp_path_factory.mktemp("media")),
            "RECON_ALERT_SLACK_WEBHOOK_URL": receivers.slack_url,
            "RECON_ALERT_PAGERDUTY_ROUTING_KEY": ROUTING_KEY,
            "RECON_ALERT_PAGERDUTY_URL": receivers.pagerduty_url,
            "RECON_ALERT_RUNBOOK_BASE_URL": RUNBOOKS,
            "RECON_DAGSTER_UI_URL": f"http://127.0.0.1:{port}",
        }
        (home.path / ".nux").mkdir()
        (home.path / ".nux" / "nux.yaml").write_text("seen: 1\n")
        with dagster_dev_process(home, env, port=port) as dev:
            everyone = [j for v in seeded.values() for j in (v if isinstance(v, list) else [v])]
            wait_for(
                lambda: _worked(engine, everyone),
                timeout_s=300,
                what="the daemon to work every job",
                interval_s=2,
                logs=dev.log_tail,
            )
            health = _launch(dev.url, "reconcile_health_job")
            with home.instance() as instance:
                wait_for(
                    lambda: (r := instance.get_run_by_id(health)) is not None and r.is_finished,
                    timeout_s=180,
                    what="the health job",
                    interval_s=2,
                    logs=dev.log_tail,
                )
            wait_for(
                lambda: (
                    len(receivers.accepted("/slack/")) >= 2 and len(receivers.accepted("/pagerduty/")) >= 2
                ),
                timeout_s=120,
                what="the alert sensor to page Slack and PagerDuty",
                interval_s=2,
                logs=dev.log_tail,
            )
            yield {
                "url": dev.url,
                "seeded": seeded,
                "engine": engine,
                "receivers": receivers,
                "health": health,
                "sandbox": sandbox,
            }


@pytest.fixture(scope="module")
def console(outage: dict) -> Iterator[Console]:
    with open_console(outage["url"], 1400, 900) as c:
        yield c


def _check_row(page: Any, name: str) -> Any:
    return page.locator(f"[title='{name}']").first.locator("xpath=..")


def test_the_outage_shows_on_the_overview_and_the_runs_page(console: Console, outage: dict):
    console.open("/overview/activity/timeline", wait_text="reconcile")
    console.shot("outage-overview-timeline")
    # 1. The health run fails while ElevenLabs is DOWN: Runs → Failed shows it, tagged as its outage.
    console.open("/runs?q%5B0%5D=status%3AFAILURE", wait_text="reconcile_health_job")
    failed = console.text()
    assert "recon/outcome: provider_outage" in failed and "recon/provider: elevenlabs" in failed
    console.shot("outage-runs-failed")
    # Replicate's runs in which a share of the jobs got no answer are told apart without filtering.
    console.open("/runs", wait_text="recon/outcome: degraded")
    console.shot("outage-runs-degraded")
    console.open("/runs?q%5B0%5D=tag%3Arecon%2Foutcome%3Ddegraded", wait_text="recon/outcome: degraded")
    assert "replicate" in console.text()


def test_provider_health_says_down_degraded_and_slow(console: Console, outage: dict):
    from playwright.sync_api import expect

    page = console.open("/assets/provider_health?view=checks", wait_text="provider_health")
    expect(_check_row(page, "elevenlabs")).to_contain_text("failed", ignore_case=True, timeout=60_000)
    expect(_check_row(page, "replicate")).not_to_contain_text("succeeded", ignore_case=True, timeout=60_000)
    expect(_check_row(page, "fal")).to_contain_text("succeeded", ignore_case=True, timeout=60_000)
    console.shot("outage-provider-health")
    _check_row(page, "replicate").click()
    page.get_by_text("replicate DEGRADED:", exact=False).first.wait_for(timeout=60_000)
    console.shot("outage-provider-health-replicate-degraded")
    page = console.open("/assets/provider_health?view=checks", wait_text="provider_health")
    _check_row(page, "fal").click()
    page.get_by_text("slow: answers take", exact=False).first.wait_for(timeout=60_000)
    console.shot("outage-provider-health-fal-slow")


def test_the_pages_carry_their_runbook_and_the_cap_is_told(console: Console, outage: dict):
    from recon_dagster.operator.explain import explain, to_text

    receivers = outage["receivers"]
    slack = [r.json for r in receivers.accepted("/slack/")]
    pd = [r.json for r in receivers.accepted("/pagerduty/")]
    down = [m for m in slack if "elevenlabs is DOWN" in m["text"]]
    assert down and "First step:" in down[0]["text"], slack
    assert f"{RUNBOOKS}operations.md#runbook-provider-health" in str(down[0]["blocks"])
    triggers = [e for e in pd if e["event_action"] == "trigger"]
    assert triggers and all(e["payload"]["custom_details"].get("first_step") for e in triggers), pd
    assert all(any(link["text"] == "runbook" for link in e.get("links", [])) for e in triggers), pd
    # The force-fail at the cap: paged with the window's count and kind, and its story says where
    # its task was upstream.
    cap = [m for m in slack if "no_new_exhausted_jobs" in str(m["blocks"])]
    assert (
        cap
        and "force-failed at the attempt cap and refunded in the last 30 min (fal-image 1)" in cap[0]["text"]
    )
    story = to_text(explain(outage["engine"], None, outage["seeded"]["fal_cap"]), None)
    assert "at fal" in story, story

    # stuck_jobs: the force-failed job is gone, the rest is a table with attempt n of max.
    page = console.open("/assets/stuck_jobs", wait_text="near_cap")
    console.shot("outage-stuck-jobs")
    assert str(outage["seeded"]["fal_cap"]) not in console.text()
    page.get_by_text("[Show Markdown]", exact=False).first.click()
    page.get_by_text("attempt", exact=False).first.wait_for(timeout=30_000)
    console.shot("outage-stuck-jobs-table")


def test_the_cap_cancels_its_task_and_stuck_jobs_lists_only_the_stuck(console: Console, outage: dict):
    from recon_dagster.operator.explain import explain, to_text

    engine, seeded = outage["engine"], outage["seeded"]
    with engine.connect() as conn:
        task = conn.execute(
            sa.text("SELECT provider_task_id FROM jobs WHERE id = :j"), {"j": str(seeded["fal_cap"])}
        ).scalar_one()
    # 4. Still queued at fal when it was force-failed: cancelled there, and its story says so.
    assert outage["sandbox"].task_info(task)["canceled"] is True
    story = to_text(explain(engine, None, seeded["fal_cap"]), None)
    assert f"{task}; the job's task, cancelled" in story, story
    # 6. Only the stuck are listed, each with why; the healthy are counted apart.
    page = console.open("/assets/stuck_jobs", wait_text="running_fine")
    page.get_by_text("[Show Markdown]", exact=False).first.click()
    page.get_by_text("did not answer its last poll", exact=False).first.wait_for(timeout=60_000)
    shown = console.text()
    console.shot("outage-stuck-jobs-only-stuck")
    assert all(str(j) in shown for j in seeded["replicate_down"]), shown
    assert not [j for j in seeded["replicate_up"] if str(j) in shown], shown


def test_a_stuck_rows_story_is_one_click_away_without_a_run(console: Console, outage: dict):
    """Item 7: stuck_jobs → [Show Markdown] → a row's "story" link: the job's job_story page."""
    down = outage["seeded"]["replicate_down"][0]
    page = console.open("/assets/stuck_jobs", wait_text="running_fine")
    page.get_by_text("[Show Markdown]", exact=False).first.click()
    page.get_by_text(str(down), exact=False).first.wait_for(timeout=60_000)
    # The markdown table in the dialog (the page behind it has the sortable table, links as text).
    row = page.get_by_role("dialog").locator("tr", has_text=str(down)).first
    row.get_by_role("link", name="story").click()
    page.get_by_text("upstream said last", exact=False).first.wait_for(timeout=60_000)
    page.get_by_text("HTTP 503", exact=False).first.wait_for(timeout=30_000)
    assert str(down) in page.url and "job_story" in page.url
    console.shot("outage-job-story-from-stuck-row")
    # The force-failed job's page: its task cancelled at fal, on the story behind one click.
    cap = outage["seeded"]["fal_cap"]
    page = console.open(f"/assets/job_story?view=partitions&partition={cap}", wait_text="upstream said last")
    page.get_by_text("[Show Markdown]", exact=False).first.click()
    page.get_by_text("the job's task, cancelled", exact=False).first.wait_for(timeout=60_000)
    console.shot("outage-job-story-cap")


def _dump(console: Console, name: str) -> str:
    """The page's text, kept beside its screenshot (what an assertion below read)."""
    text = console.text()
    (console.shot(name).with_suffix(".txt")).write_text(text)
    return text


def test_8_the_catalog_leads_with_oncall_and_shows_what_is_open(console: Console, outage: dict):
    """Item 8: the Catalog (one table sorted by asset name) opens on active_incidents, red, in the
    recon_oncall group (open incidents, provider health, stuck jobs); the open incidents are an
    asset page: what, severity, first step, runbook."""
    from playwright.sync_api import expect

    page = console.open("/assets", wait_text="active_incidents")
    page.wait_for_timeout(3000)  # the Status column loads after the rows
    text = _dump(console, "outage-catalog")
    assets = [
        a for a in ("active_incidents", "anthropic_spend", "credit_anomalies", "provider_health") if a in text
    ]
    assert assets[0] == "active_incidents" and min(assets, key=text.index) == "active_incidents", assets
    assert text.index("recon_oncall") < text.index("anthropic_spend"), text[:2000]
    # Its group: the on-call assets together, one click away.
    page.get_by_role("link", name="recon_oncall").first.click()
    for name in ("active_incidents", "provider_health", "stuck_jobs"):
        page.get_by_text(name, exact=True).first.wait_for(timeout=60_000)
    console.shot("outage-oncall-group")
    # The open incidents: ElevenLabs DOWN and the force-fail at the cap, each with its first step.
    page = console.open("/assets/active_incidents", wait_text="active_incidents")
    expect(page.get_by_text("elevenlabs is DOWN (provider_health)").first).to_be_visible(timeout=60_000)
    text = _dump(console, "outage-active-incidents")
    assert (
        "check:provider_health:elevenlabs" in text and "check:credit_anomalies:no_new_exhausted_jobs" in text
    )
    assert "Read the alert's last reason" in text
    assert f"{RUNBOOKS}operations.md#runbook-provider-health" in text
    # Its check is red while they are open.
    page = console.open("/assets/active_incidents?view=checks", wait_text="none_open")
    expect(_check_row(page, "none_open")).to_contain_text("failed", ignore_case=True, timeout=60_000)
    console.shot("outage-active-incidents-check")


def test_8_outcome_plots_are_per_kind_and_never_flat_zero(console: Console, outage: dict):
    """Item 8: outcomes_by_provider/fal plots what happened to fal's jobs (still running, one
    force-failed and refunded at the cap), each labelled with its kind and unit, and has no plot
    for what never happened (nothing recovered, failed upstream or swept)."""
    page = console.open("/assets/outcomes_by_provider/fal", wait_text="fal-image: still_running (jobs)")
    page.get_by_role("button", name="Plots").first.click(timeout=60_000)
    page.locator("canvas").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)  # Chart.js draws
    text = _dump(console, "outage-outcome-plots-fal")
    for shown in (
        "fal-image: still_running (jobs)",
        "fal-image: force_failed (jobs)",
        "fal-image: worked (jobs)",
    ):
        assert shown in text, text
    for never in ("recovered", "failed_refunded", "swept", "lost_race_or_skipped"):
        assert f"fal-image: {never} (jobs)" not in text, text
    assert page.locator("canvas").count() >= 3
    # Replicate's degraded kind plots its unanswered polls.
    console.open("/assets/outcomes_by_provider/replicate", wait_text="replicate-prediction: errors (jobs)")
    assert "replicate-prediction: recovered (jobs)" not in console.text()
