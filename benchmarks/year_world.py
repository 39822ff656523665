"""What ``year.py`` shares for its sampled days: a world (the app's database, a Dagster instance on
PostgreSQL, the project's definitions wired to them and to the loopback sandbox), one sampled day
of stuck jobs run through the real reconciler, retention on a compressed clock, the Dagster
storage's sizes and the UI's GraphQL latency. Not a benchmark of its own (no ``main``).

The compressed clock: a sampled day runs now, in real time, and its rows are then re-dated to
the simulated day (every timestamp of its jobs, their usage, attempts and decisions moved back
by the same interval). Between ticks the jobs' backoff is ended at once (``reconcile_next_at``
set to now: the hours between attempts pass in a moment), except the provider's Retry-After
(1 s), which is waited out for real. Each tick stands for a simulated hour: the pruned world runs
a retention pass after each (the hourly schedule's cadence), called directly (no daemon), with
cutoffs taken at the simulated hour. Dagster stamps a sampled day's runs with real time; when the
day is over they are re-dated to it too (``year_runs.redate``: every timestamp of the runs and
their events), so run retention runs on the simulated clock like the rest. A sampled day without
an outage becomes the template the bulk days' runs are cloned from (``year_runs.py``).
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import sqlalchemy as sa
from harness import Seeded, inflight, insert_jobs, verify
from year_runs import Template, clone, keep_template, last_run_id, redate, storage

from recon_dagster.cli.run_once import reconcile_once
from recon_dagster.config import settings
from recon_dagster.core.kinds import ASYNC_KINDS, SYNC_KINDS, get_kind
from recon_dagster.db.engine import DATABASE_URL_ENV, get_engine, with_database
from recon_dagster.db.migrate import migrate
from recon_dagster.db.retention import Horizons, cutoffs, prune_pass
from recon_dagster.definitions import build_defs
from recon_dagster.defs.explain.stories import PARTITIONS
from recon_dagster.defs.resources import ReconcileSettingsResource
from recon_dagster.defs.retention.runs import prune_runs
from recon_dagster.defs.retention.stories import prune_stories
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.instance import ensure_database

DAY = timedelta(days=1)
MAX_TICKS = 12
OUTAGE_ERRORS = 7  # 5xx answers per task: the client's own retries use 3-4 of them an attempt
DAGSTER_TABLES = ("runs", "run_tags", "event_logs", "asset_event_tags", "dynamic_partitions", "job_ticks")

# Shift one sampled day's rows back to their simulated day (:jobs their ids, :shift seconds).
REDATE = (
    "UPDATE jobs SET created_at = created_at - make_interval(secs => :shift), "
    "provider_call_started_at = provider_call_started_at - make_interval(secs => :shift), "
    "completed_at = completed_at - make_interval(secs => :shift), "
    "updated_at = updated_at - make_interval(secs => :shift) WHERE id = ANY(CAST(:jobs AS uuid[]))",
    "UPDATE usage_logs SET created_at = created_at - make_interval(secs => :shift), "
    "settled_at = settled_at - make_interval(secs => :shift) WHERE job_id = ANY(CAST(:jobs AS uuid[]))",
    "UPDATE reconcile_events SET created_at = created_at - make_interval(secs => :shift) "
    "WHERE job_id = ANY(CAST(:jobs AS uuid[]))",
    "UPDATE reconcile_decisions SET created_at = created_at - make_interval(secs => :shift) "
    "WHERE job_id = ANY(CAST(:jobs AS uuid[]))",
)


@dataclass
class DayReport:
    jobs: int = 0
    ticks: int = 0
    runs: int = 0
    failed_runs: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    retention_passes: int = 0
    retention_s: float = 0.0
    slowest_batch_s: float = 0.0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        top = ", ".join(f"{k} {n}" for k, n in self.outcomes.most_common(6))
        passes = (
            f"; {self.retention_passes} hourly passes {self.retention_s:.1f} s (slowest batch "
            f"{self.slowest_batch_s * 1000:.0f} ms)"
            if self.retention_passes
            else ""
        )
        bad = (
            f"; PROBLEMS: {'; '.join(self.problems)}" if self.problems else "; nothing lost or settled twice"
        )
        return (
            f"{self.jobs} stuck jobs, {self.ticks} ticks, {self.runs} runs ({self.failed_runs} failed): {top}"
            f"{passes}; {self.seconds:.1f} s{bad}"
        )


class World:
    """One side of the year: its app database, its Dagster instance, the definitions on both."""

    def __init__(self, server: str, mode: str, media_dir: str, horizons: Horizons) -> None:
        self.mode, self.horizons = mode, horizons
        tag = secrets.token_hex(3)
        self.names = [f"recon_bench_year_{mode}_{tag}", f"recon_bench_year_{mode}_{tag}_dagster"]
        for name in self.names:
            ensure_database(server, name)
        self.url = with_database(server, self.names[0])
        self.dagster_url = with_database(server, self.names[1])
        self.engine = get_engine(self.url)
        migrate(self.engine)
        pg_url = (
            sa.make_url(self.dagster_url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        self._instance_cm = dg.instance_for_test(
            overrides={"storage": {"postgres": {"postgres_url": pg_url}}}
        )
        self.instance = self._instance_cm.__enter__()
        self.media_dir = media_dir
        self.defs: dg.Definitions | None = None
        self.dagster_engine = get_engine(self.dagster_url)
        self.template: Template | None = None
        self.template_outage = False
        self.pending: list[datetime] = []  # bulk days waiting for a template
        self.cloned: list[tuple[datetime, float]] = []  # (bulk day, seconds its clone took)
        self.real_runs: set[str] = set()  # the sampled days' own runs
        self.run_page = ""
        self.runs_pruned: list[tuple[float, int]] = []  # each run-retention pass: (seconds, runs)

    def use(self) -> dg.Definitions:
        """Point the project's database resource at this world (and build its definitions)."""
        os.environ[DATABASE_URL_ENV] = self.url
        if self.defs is None:
            self.defs = build_defs(
                {
                    "providers": providers_from_env(),
                    "media_store": LocalMediaStore(base_dir=self.media_dir),
                    "reconcile_settings": ReconcileSettingsResource(),
                }
            )
        return self.defs

    def close(self) -> None:
        self._instance_cm.__exit__(None, None, None)

    # -- retention on the simulated clock ---------------------------------------------------------

    def retention(self, sim_now: datetime, budget_s: float = 3600) -> tuple[float, float, int]:
        """One prune_history pass as it would run at ``sim_now``: our tables, the job_story pages,
        our runs. (seconds, slowest batch, rows + pages + runs deleted)"""
        t0 = time.monotonic()
        report = prune_pass(self.engine, cutoffs(sim_now, self.horizons), batch=1000, budget_s=budget_s)
        now = settings()
        story_cut = sim_now - timedelta(days=now.retention_job_stories_days)
        stories = prune_stories(self.instance, self.engine, story_cut, budget_s=budget_s)
        jobs = self.use().get_repository_def().job_names
        r0 = time.monotonic()
        runs = prune_runs(
            self.instance, jobs, now=sim_now, days=now.retention_runs_days,
            failed_days=now.retention_failed_runs_days, our_label=None, max_runs=100_000,
        ).deleted  # fmt: skip
        self.runs_pruned.append((time.monotonic() - r0, runs))
        deleted = sum(report.deleted.values()) + stories.deleted + runs
        return time.monotonic() - t0, report.slowest_batch_s, deleted

    # -- one sampled day --------------------------------------------------------------------------

    def sampled_day(
        self, sandbox: SandboxServer, sim_day: datetime, stuck: int, rng: random.Random, *, outage: bool
    ) -> DayReport:
        """``stuck`` jobs of ``sim_day`` left in flight by dead workers, reconciled by the real
        sensor and runs (``reconcile_once``), a tick per simulated hour. ``outage``: the provider
        most of them poll answers 5xx to each of its tasks' first ``OUTAGE_ERRORS`` requests
        (several attempts, each retried by the client); one task in five elsewhere gets a 429
        with Retry-After first."""
        report = DayReport(jobs=stuck)
        started = time.monotonic()
        defs = self.use()
        after = last_run_id(self.dagster_engine)
        ids, users, tasks = [], [], []
        expected: Counter[str] = Counter()
        kinds = [
            rng.choice(SYNC_KINDS) if rng.random() < 0.1 else rng.choice(ASYNC_KINDS) for _ in range(stuck)
        ]
        # The outage hits the provider most of the day's stuck jobs poll.
        down = Counter(get_kind(k).provider for k in kinds if k in ASYNC_KINDS).most_common(1)
        for i, kind in enumerate(kinds):
            ids.append(str(uuid.uuid4()))
            users.append(str(uuid.uuid4()))
            if kind not in ASYNC_KINDS:
                tasks.append(None)
                expected["failed"] += 1  # a sync call that died with its worker: the sweep fails it
                continue
            outcome = "fail" if rng.random() < 0.1 else "succeed"
            scenario = Scenario(outcome=outcome, polls_before_done=rng.choice((0, 1)), media_size=2048)
            if outage and down and get_kind(kind).provider == down[0][0]:
                scenario.server_error_first = OUTAGE_ERRORS
            elif i % 5 == 0:
                scenario.rate_limit_first, scenario.retry_after_s = 1, 1
            tasks.append(sandbox.add_task(kind, scenario))
            expected["completed" if outcome == "succeed" else "failed"] += 1
        age = max(get_kind(k).stale_threshold.total_seconds() for k in set(kinds)) + 600
        insert_jobs(self.engine, ids, users, kinds, tasks, [age] * stuck)
        hour = 0
        for hour in range(1, 25):
            if report.ticks < MAX_TICKS and inflight(self.engine, ids):
                once = reconcile_once(defs, instance=self.instance, sweep=True)
                report.ticks += 1
                report.runs += once.runs
                report.failed_runs += once.failed_runs
                report.outcomes.update(once.summary.counts)
                with self.engine.begin() as conn:  # the hours between attempts pass at once
                    conn.execute(
                        sa.text(
                            "UPDATE jobs SET reconcile_next_at = now() WHERE id = ANY(CAST(:ids AS uuid[])) "
                            "AND status IN ('pending', 'processing') AND reconcile_next_at > now()"
                        ),
                        {"ids": ids},
                    )
                time.sleep(1.1)  # the sandbox's Retry-After (1 s) is waited out for real
            if self.mode == "pruned":
                seconds, slowest, _ = self.retention(sim_day + timedelta(hours=hour))
                report.retention_passes += 1
                report.retention_s += seconds
                report.slowest_batch_s = max(report.slowest_batch_s, slowest)
        report.problems = verify(self.engine, Seeded(ids, users, expected))
        shift = (datetime.now(UTC) - (sim_day + timedelta(hours=12))).total_seconds()
        with self.engine.begin() as conn:
            for statement in REDATE:
                conn.execute(sa.text(statement), {"jobs": ids, "shift": shift})
        run_ids = redate(self.dagster_engine, after, shift)
        self.real_runs.update(run_ids)
        if self.template is None or (self.template_outage and not outage):
            self.template = keep_template(self.dagster_engine, run_ids, sim_day)
            self.template_outage = outage
            for day in self.pending:
                self.bulk_runs(day)
            self.pending = []
        report.seconds = time.monotonic() - started
        return report

    def bulk_runs(self, day: datetime) -> None:
        """A bulk-seeded day's Dagster runs: the template's, cloned onto ``day`` (or later, once
        the first sampled day has made a template)."""
        if self.template is None:
            self.pending.append(day)
        else:
            self.cloned.append((day, clone(self.dagster_engine, self.template, day)))

    # -- what the instance holds, and what its UI pages cost ----------------------------------------

    def dagster_sizes(self) -> str:
        engine = self.dagster_engine
        parts = [storage(engine)]
        with engine.connect() as conn:
            for t in DAGSTER_TABLES:
                rows, table, idx = conn.execute(
                    sa.text(
                        f"SELECT (SELECT count(*) FROM {t}), pg_table_size('{t}'), pg_indexes_size('{t}')"
                    )
                ).one()
                parts.append(f"{t} {rows:,} rows {table / 2**20:.1f}+{idx / 2**20:.1f} MiB")
        return "; ".join(parts)

    def graphql_ms(self, times: int = 5) -> dict[str, float]:
        """Median latency of the UI's asset page (job_story: its partitions, their statuses, the
        latest materializations), a run's page (the run and its event log) and the runs list,
        executed in-process through dagster-graphql's schema (what the webserver's /graphql runs,
        without HTTP)."""
        from dagster._core.test_utils import in_process_test_workspace
        from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
        from dagster_graphql.test.utils import execute_dagster_graphql

        self.use()
        records = self.instance.get_run_records(filters=dg.RunsFilter(job_name="reconcile_job"), limit=1)
        self.run_page = "no run"
        if records:
            run = records[0]
            real = run.dagster_run.run_id in self.real_runs
            self.run_page = (
                f"{run.dagster_run.run_id[:8]} ({'a sampled day' if real else 'a clone'}'s reconcile run, "
                f"{run.create_timestamp:%Y-%m-%d})"
            )
        queries: dict[str, tuple[str, dict[str, Any]]] = {
            "asset page (job_story)": (ASSET_PAGE, {"key": {"path": ["job_story"]}}),
            "runs list": (RUNS_LIST, {}),
        }
        if records:  # the latest reconcile run's page (none left once retention deleted them all)
            queries["run page"] = (RUN_PAGE, {"runId": records[0].dagster_run.run_id})
        out: dict[str, float] = {}
        origin = LoadableTargetOrigin(module_name="recon_dagster.definitions", attribute="defs")
        with in_process_test_workspace(self.instance, origin) as context:
            for name, (query, variables) in queries.items():
                samples = []
                for _ in range(times + 1):  # the first warms the workspace's caches
                    t0 = time.perf_counter()
                    result = execute_dagster_graphql(context, query, variables)
                    samples.append((time.perf_counter() - t0) * 1000)
                    if result.errors:
                        raise RuntimeError(f"{name}: {result.errors[0]}")
                out[name] = statistics.median(samples[1:])
        asyncio.set_event_loop(asyncio.new_event_loop())  # execute_dagster_graphql closed its loop
        return out

    def partitions(self) -> int:
        return len(self.instance.get_dynamic_partitions(PARTITIONS))


ASSET_PAGE = """
query AssetPage($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode {
      id
      partitionKeysByDimension { name partitionKeys }
      assetPartitionStatuses { __typename ... on DefaultPartitionStatuses { materializedPartitions failedPartitions } }
    }
  }
  assetOrError(assetKey: $key) {
    ... on Asset { assetMaterializations(limit: 25) { partition timestamp runId metadataEntries { label } } }
  }
}
"""

RUN_PAGE = """
query RunPage($runId: ID!) {
  runOrError(runId: $runId) {
    ... on Run { id status startTime endTime tags { key value } stats { ... on RunStatsSnapshot { stepsSucceeded } } }
  }
  logsForRun(runId: $runId, limit: 1000) {
    ... on EventConnection { cursor hasMore events { __typename ... on MessageEvent { message timestamp } } }
  }
}
"""

RUNS_LIST = """
query RunsList {
  runsOrError(limit: 25) { ... on Runs { results { id status jobName startTime endTime tags { key value } } } }
}
"""
