"""The operator's console in a real browser.

Headless Chromium (Debian's ``chromium`` package, driven by Playwright) against ``recon-dagster
dev`` (webserver + daemon) on loopback, with dagster-postgres storage in a temporary
``DAGSTER_HOME``, the provider sandbox as its own process, and a seeded outage: 12 KIE jobs whose
polls get HTTP 500 (one of them at attempt 17), two Replicate jobs that failed upstream, one
leaked reservation. The daemon reconciles; the tests then look at what an on-call engineer sees.

Screenshots go to ``.recon/screenshots/`` (git-ignored).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.core.paths import project_root
from recon_dagster.operator import explain as ex
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.daemon import dagster_dev_process
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.harness import wait_for
from recon_dagster_tests.support.instance import dagster_home
from recon_dagster_tests.support.markers import require_marker
from recon_dagster_tests.support.sandbox_process import sandbox_process

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("RECON_CHROMIUM", "/usr/bin/chromium")
LOCATION = "recon_dagster"
SHOTS = (project_root() or Path.cwd()) / ".recon" / "screenshots"
OUTAGE_KIND = "kie-standard"


def _need_browser() -> None:
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[dev]')")
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        missing.append(f"Chromium at {CHROMIUM} (apt-get install -y chromium)")
    if missing:
        message = "browser test needs " + " and ".join(missing)
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _seed_outage(engine: sa.Engine, sandbox: Any) -> dict[str, Any]:
    user = make_user(engine, sub=1000, topup=0)
    kie: list[uuid.UUID] = []
    for i in range(12):
        task = sandbox.add_task(OUTAGE_KIND, Scenario(server_error_first=1000))
        job = make_job(
            engine,
            user,
            provider_kind=OUTAGE_KIND,
            provider_task_id=task,
            started_minutes_ago=30,
            reconcile_attempts=17 if i == 0 else 0,
        )
        reserve(engine, job, user, 10)
        kie.append(job)
    replicate = []
    for _ in range(2):
        task = sandbox.add_task("replicate-prediction", Scenario(outcome="fail", polls_before_done=0))
        job = make_job(
            engine, user, provider_kind="replicate-prediction", provider_task_id=task, started_minutes_ago=30
        )
        reserve(engine, job, user, 10)
        replicate.append(job)
    leaked = make_job(engine, user, status="failed", provider_kind="kie-standard", provider_task_id="gone")
    reserve(engine, leaked, user, 7)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET updated_at = now() - interval '30 minutes' WHERE id = :j"),
            {"j": str(leaked)},
        )
    return {"kie": kie, "at_17": kie[0], "replicate": replicate, "leaked": leaked}


def _reconciled(engine: sa.Engine, seeded: dict[str, Any]) -> bool:
    ids = [str(j) for j in seeded["kie"] + seeded["replicate"]]
    with engine.connect() as conn:
        worked = conn.execute(
            sa.text(
                "SELECT count(DISTINCT job_id) FROM reconcile_events WHERE job_id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": ids},
        ).scalar_one()
    return worked == len(ids)


def _gql(url: str, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    import httpx

    r = httpx.post(f"{url}/graphql", json={"query": query, "variables": variables or {}}, timeout=30)
    r.raise_for_status()
    body = r.json()
    assert "errors" not in body, body
    return body["data"]


def _asset_jobs(url: str) -> dict[str, list[str]]:
    """asset key (user string) -> jobs that materialize it (hidden asset jobs left out)."""
    data = _gql(url, "{ assetNodes { assetKey { path } jobNames } }")
    return {
        "/".join(n["assetKey"]["path"]): [j for j in n["jobNames"] if not j.startswith("__")]
        for n in data["assetNodes"]
    }


def _launch(url: str, job: str, run_config: dict[str, Any] | None = None) -> str:
    from dagster_graphql import DagsterGraphQLClient

    host, port = url.removeprefix("http://").split(":")
    client = DagsterGraphQLClient(host, port_number=int(port))
    return client.submit_job_execution(job, repository_location_name=LOCATION, run_config=run_config or {})


class Console:
    """The browser on the Dagster UI: page loads that wait for content, screenshots by name."""

    def __init__(self, page: Any, url: str) -> None:
        self.page = page
        self.url = url

    def open(self, path: str, wait_text: str | None = None, timeout_ms: int = 60_000) -> Any:
        self.page.goto(f"{self.url}{path}")
        # The first visit offers a newsletter sign-up; an operator dismisses it once.
        with contextlib.suppress(Exception):
            self.page.get_by_role("button", name="Skip").click(timeout=1500)
        if wait_text:
            self.page.get_by_text(wait_text, exact=False).first.wait_for(timeout=timeout_ms)
        return self.page

    def shot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path

    def text(self) -> str:
        return str(self.page.inner_text("body"))

    def outcome_plot(self, key: str, series: str, timeout_ms: int = 60_000) -> int:
        """The coloured pixels of ``key``'s first metadata plot (see ``chart_points``). Dagster 1.13
        has no working ``?view=plots`` page: the Overview tab's Metadata section has a Table /
        Plots switch; ``series`` is a metadata key to wait for (the table lists it first)."""
        page = self.open(f"/assets/{key}", wait_text=series, timeout_ms=timeout_ms)
        page.get_by_role("button", name="Plots").first.click(timeout=timeout_ms)
        return chart_points(page, timeout_ms)


def chart_points(page: Any, timeout_ms: int = 60_000) -> int:
    """How many pixels of the page's first chart are drawn in colour: its series' points and lines
    (one point of one run is ~28 pixels of (79, 67, 221)). Axes, grid and labels are grey-blue, at
    most 35 apart between channels, so they never count. Dagster draws metadata plots with
    Chart.js on a canvas; a page without a chart (a blank page, an asset never materialized)
    times out here."""
    from PIL import Image

    canvas = page.locator("canvas").first
    canvas.wait_for(timeout=timeout_ms)
    page.wait_for_timeout(1500)  # Chart.js animates the series in
    rgb = Image.open(io.BytesIO(canvas.screenshot(timeout=timeout_ms))).convert("RGB").tobytes()
    return sum(1 for i in range(0, len(rgb), 3) if max(rgb[i : i + 3]) - min(rgb[i : i + 3]) > 60)


@pytest.fixture(scope="module")
def outage(engine: sa.Engine, database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """dagster dev + sandbox + the seeded outage, reconciled by the real daemon; then the health
    job (and every job materializing credit_anomalies) and an explain_job run, launched through
    the webserver's GraphQL API as the Launchpad would."""
    _need_browser()
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "TRUNCATE jobs, usage_logs, user_credits, assets, workflow_executions, credit_anomalies, "
            "characters, reconcile_events RESTART IDENTITY CASCADE"
        )
    port = _free_port()
    media = tmp_path_factory.mktemp("media")
    with sandbox_process() as sandbox, dagster_home(database_url) as home:
        seeded = _seed_outage(engine, sandbox)
        env = {
            **sandbox.env,
            "RECON_DATABASE_URL": database_url,
            "RECON_SENSOR_INTERVAL_S": "2",
            "RECON_MEDIA_DIR": str(media),
            ex.UI_URL_ENV: f"http://127.0.0.1:{port}",
        }
        # An operator dismisses the UI's newsletter sign-up once per instance; this one has.
        (home.path / ".nux").mkdir()
        (home.path / ".nux" / "nux.yaml").write_text("seen: 1\n")
        with dagster_dev_process(home, env, port=port) as dev:
            jobs = _asset_jobs(dev.url)
            # The health job needs only the leaked reservation: launch it while the daemon works.
            launched = {_launch(dev.url, j): j for j in jobs.get("inflight_backlog", [])[:1]}
            wait_for(
                lambda: _reconciled(engine, seeded),
                timeout_s=150,
                what="the daemon to reconcile the outage",
                interval_s=1,
                logs=dev.log_tail,
            )
            with home.instance() as instance:
                batch_job = seeded["kie"][1]
                story = ex.explain(engine, instance, batch_job)
                batch_run = story.attempts[0].run_id
                assert batch_run, f"no run found for the batch of job {batch_job}"
                config = {"ops": {"explain_job_story": {"config": {"job_id": str(batch_job)}}}}
                launched[_launch(dev.url, "explain_job", config)] = "explain_job"
                for job in jobs.get("credit_anomalies", [])[:1]:
                    if job not in launched.values():
                        launched[_launch(dev.url, job)] = job

                def finished() -> bool:
                    runs = [instance.get_run_by_id(r) for r in [batch_run, *launched]]
                    return all(r is not None and r.is_finished for r in runs)

                wait_for(
                    finished,
                    timeout_s=150,
                    what="the batch, health and explain runs",
                    interval_s=1,
                    logs=dev.log_tail,
                )
                explain_run = next(r for r, j in launched.items() if j == "explain_job")
                batch_status = instance.get_run_by_id(batch_run).status.value  # type: ignore[union-attr]
            yield {
                "url": dev.url,
                "seeded": seeded,
                "batch_job": batch_job,
                "batch_run": batch_run,
                "batch_status": batch_status,
                "explain_run": explain_run,
                "asset_jobs": jobs,
                "engine": engine,
            }


@contextmanager
def open_console(url: str, width: int, height: int) -> Iterator[Console]:
    """Headless Debian Chromium on the Dagster UI at ``url``, closed on the way out."""
    require_marker("browser", what="a browser")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": width, "height": height})
        try:
            yield Console(context.new_page(), url)
        finally:
            context.close()
            browser.close()


@pytest.fixture(scope="module")
def console(outage: dict) -> Iterator[Console]:
    with open_console(outage["url"], 1280, 760) as c:
        yield c


def _toggle_on(page: Any, name: str) -> bool:
    """Whether the automation list's row named ``name`` (a schedule) has its on/off switch on."""
    row = page.get_by_text(name, exact=True).first.locator("xpath=ancestor::div[@data-index][1]")
    from playwright.sync_api import expect

    # Each row loads its own state: wait for its subtitle, then for its switch to be live.
    expect(row).to_contain_text("Scheduled", timeout=60_000)
    boxes = row.locator("input[type=checkbox]")
    expect(boxes).to_have_count(2, timeout=30_000)  # the row's select box, then the on/off switch
    expect(boxes.last).to_be_enabled(timeout=30_000)
    return bool(boxes.last.is_checked())


def test_sensor_and_schedules_are_running_in_the_location_recon_dagster(console: Console):
    from playwright.sync_api import expect

    page = console.open("/automation", wait_text="reconcile_health_schedule")
    for name in ("sync_sweep_schedule", "reconcile_health_schedule", "lora_training_migration_schedule"):
        assert _toggle_on(page, name), f"{name} is not running"
    assert LOCATION in console.text() and "recon_dagster.definitions" not in console.text()
    console.shot("automation-running")
    # The sensor's list row shows a spinner while a tick is evaluated (every 2 s here): its own
    # page has the switch and the tick history.
    page = console.open(f"/locations/{LOCATION}/sensors/stale_inflight_jobs_sensor", wait_text="Latest tick")
    page.get_by_text("Running", exact=True).first.wait_for(timeout=30_000)
    switch = page.locator("input[type=checkbox]")
    expect(switch).to_have_count(1, timeout=30_000)
    expect(switch).to_be_checked(timeout=30_000)
    page.get_by_text("runs requested", exact=False).first.wait_for(timeout=30_000)
    console.shot("sensor-running")


def test_nested_kie_resource_page_loads(console: Console):
    page = console.open(f"/locations/{LOCATION}/resources/providers", wait_text="Resource dependencies")
    page.get_by_role("link", name="kie").first.click()
    page.wait_for_url(f"**/locations/{LOCATION}/resources/kie", timeout=30_000)
    # Its configuration: the API key's env var name (never its value) and the base URL field.
    page.get_by_text("KIE_API_KEY").first.wait_for(timeout=60_000)
    page.get_by_text("base_url", exact=True).first.wait_for(timeout=30_000)
    assert "Could not load resource" not in console.text()
    console.shot("resource-kie")


def test_a_job_inside_the_outage_batch_is_found(console: Console, outage: dict):
    job = str(outage["batch_job"])
    # (1) explain_job, launched with the job id: the story with a link to the batch run.
    # The run log is virtualized: filter it to the lines wanted so they are on screen.
    page = console.open(f"/runs/{outage['explain_run']}", wait_text="explain_job_story")
    log_filter = page.get_by_placeholder("Filter", exact=False).first
    log_filter.fill("attempt 1 at")
    page.get_by_text(f"/runs/{outage['batch_run']}", exact=False).first.wait_for(timeout=60_000)
    log_filter.fill("provider task id")
    page.get_by_text(f"job: {job}", exact=False).first.wait_for(timeout=60_000)
    page.get_by_text("upstream said last", exact=False).first.wait_for(timeout=30_000)
    console.shot("explain-job-run")
    # (2) the batch run's log, searched for the job id.
    page = console.open(f"/runs/{outage['batch_run']}", wait_text="reconcile")
    search = page.get_by_placeholder("Filter", exact=False).first
    search.fill(job)
    page.get_by_text(f"job {job}").first.wait_for(timeout=30_000)
    console.shot("batch-run-log-search")


def test_the_credit_leak_check_fails_on_the_leaked_reservation(console: Console):
    page = console.open("/assets/inflight_backlog?view=checks", wait_text="no_credit_leak")
    # The check list shows each check's last result under its name.
    from playwright.sync_api import expect

    item = page.locator("[title='no_credit_leak']").first.locator("xpath=..")
    expect(item).to_contain_text("failed", ignore_case=True, timeout=60_000)
    item.click()
    page.get_by_text("credits_held").first.wait_for(timeout=60_000)  # the failed check's metadata
    console.shot("checks-credit-leak-failed")


def test_the_outage_run_is_shown_failed(console: Console, outage: dict):
    page = console.open(f"/runs/{outage['batch_run']}", wait_text="reconcile")
    console.shot("outage-run")
    assert outage["batch_status"] == "FAILURE", f"the outage batch run ended {outage['batch_status']}"
    page.get_by_text("Failure", exact=False).first.wait_for(timeout=30_000)
    console.open("/runs?q%5B0%5D=status%3AFAILURE", wait_text="reconcile_job")
    console.shot("runs-failed-filter")


def test_outcome_plots_render(console: Console, outage: dict):
    # The KIE outage's series: each reconcile run that touched KIE is one point of "kie-standard: errors (jobs)".
    assert console.outcome_plot("outcomes_by_provider/kie", "kie-standard: errors (jobs)") >= 10, (
        "the chart has no point"
    )
    console.shot("outcome-plots")


def test_credit_anomaly_check_renders_failed(console: Console, outage: dict):
    assert "credit_anomalies" in outage["asset_jobs"], sorted(outage["asset_jobs"])
    page = console.open("/assets/credit_anomalies?view=checks", wait_text="credit_anomalies")
    page.get_by_text("Failed", exact=False).first.wait_for(timeout=60_000)
    console.shot("checks-credit-anomalies")
