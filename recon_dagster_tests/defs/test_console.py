"""What the operator's console shows: run tags, severity, stuck jobs and the operator's
actions. Real PostgreSQL, the loopback sandbox and a throwaway Dagster instance."""

from __future__ import annotations

import logging

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import KINDS, MAX_ATTEMPTS, provider_names
from recon_dagster.core.runtags import JOB_TAG_PREFIX, job_tag, run_label
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import make_defs, stale_job_id, tick


def _runs_of(instance: dg.DagsterInstance, job) -> list[dg.DagsterRun]:
    key, value = job_tag(job)
    return list(instance.get_runs(filters=dg.RunsFilter(tags={key: value})))


@pytest.mark.parametrize("kind", ["kie-standard", "replicate-prediction", "elevenlabs-async"])
def test_a_partition_run_launched_without_config_carries_its_kind_provider_and_job_tags(
    db, instance, media_dir, sandbox, kind
):
    """The Launchpad / backfill shape: a partition, no run config, no tags of ours."""
    job = stale_job_id(db, sandbox, kind, job_type="audio" if kind.startswith("eleven") else "image")
    other = stale_job_id(db, sandbox, "kie-veo" if kind != "kie-veo" else "kie-standard", job_type="video")
    defs = make_defs(media_dir)

    res = defs.resolve_job_def("reconcile_job").execute_in_process(
        instance=instance, partition_key=kind, raise_on_error=False
    )

    run = instance.get_run_by_id(res.run_id)
    assert run.tags["recon/provider_kind"] == kind
    assert run.tags["recon/provider"] == str(KINDS[kind].provider)
    assert job_row(db, job)["status"] == "completed"
    # The job it worked finds the run by one tag; the job of another kind does not.
    assert [r.run_id for r in _runs_of(instance, job)] == [res.run_id]
    assert _runs_of(instance, other) == []
    assert run_label(run) == kind


def test_every_job_of_a_batch_run_finds_that_run_by_its_tag(db, instance, media_dir, sandbox):
    jobs = [stale_job_id(db, sandbox, "kie-veo", job_type="video") for _ in range(6)]
    defs = make_defs(media_dir, batch_size=3, single_run_below=2)

    report = tick(defs, instance)

    assert report.runs == 2
    found = {j: _runs_of(instance, j) for j in jobs}
    assert all(len(runs) == 1 for runs in found.values())
    assert len({runs[0].run_id for runs in found.values()}) == 2
    for runs in found.values():
        assert runs[0].tags["recon/provider_kind"] == "kie-veo"


def test_the_alert_names_the_kind_of_a_partition_run_and_the_sweep_only_for_the_sweep():
    part = dg.DagsterRun(job_name="reconcile_job", tags={"dagster/partition": "kie-suno"})
    tagged = dg.DagsterRun(job_name="reconcile_job", tags={"recon/provider_kind": "kie-veo"})
    sweep = dg.DagsterRun(job_name="sync_sweep_job", tags={})
    assert (run_label(part), run_label(tagged), run_label(sweep)) == ("kie-suno", "kie-veo", "sweep")


def _run_ids(instance: dg.DagsterInstance) -> list[str]:
    return [r.run_id for r in instance.get_runs(filters=dg.RunsFilter(job_name="reconcile_job"))]


def _logged(instance: dg.DagsterInstance, level: int) -> list[str]:
    return [e.user_message for r in _run_ids(instance) for e in instance.all_logs(r) if e.level >= level]


def _failed_checks(instance: dg.DagsterInstance) -> list[tuple[str, str]]:
    out = []
    for r in _run_ids(instance):
        for e in instance.all_logs(r, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
            ev = e.dagster_event.event_specific_data
            if not ev.passed:
                out.append((ev.asset_key.to_user_string(), ev.check_name))
    return out


def test_a_force_fail_at_the_cap_is_a_warning_and_fails_a_check(db, instance, media_dir, sandbox):
    job = stale_job_id(
        db, sandbox, "kie-standard", Scenario(outcome="run_forever"), attempts=MAX_ATTEMPTS - 1
    )

    tick(make_defs(media_dir), instance)

    assert job_row(db, job)["status"] == "failed"
    warnings = _logged(instance, logging.WARNING)
    assert any(str(job) in w and "exhausted" in w for w in warnings), warnings
    assert ("credit_anomalies", "no_new_exhausted_jobs") in _failed_checks(instance)


def test_a_per_job_error_line_is_a_warning_and_a_quiet_run_fails_no_check(db, instance, media_dir, sandbox):
    bad = stale_job_id(db, sandbox, "kie-standard", Scenario(polls_before_done=0, malformed=True))
    stale_job_id(db, sandbox, "kie-standard")

    tick(make_defs(media_dir), instance)

    warnings = _logged(instance, logging.WARNING)
    assert any(str(bad) in w and "error" in w for w in warnings), warnings
    assert _failed_checks(instance) == []


def test_a_sensor_run_is_not_re_tagged_with_the_job_tags_its_request_carried(
    db, instance, media_dir, sandbox, monkeypatch
):
    """The sensor's request already carries one tag per job; re-adding them made Dagster re-write
    each (one UPDATE per tag): a run adds only the job tags it lacks."""
    jobs = [stale_job_id(db, sandbox, "kie-veo", job_type="video") for _ in range(4)]
    added: list[dict[str, str]] = []
    real_add = instance.add_run_tags

    def spy(run_id: str, tags: dict[str, str]) -> None:
        added.append(dict(tags))
        real_add(run_id, tags)

    monkeypatch.setattr(instance, "add_run_tags", spy)

    report = tick(make_defs(media_dir, batch_size=2, single_run_below=1), instance)

    assert report.runs == 2
    assert not [t for t in added if any(k.startswith(JOB_TAG_PREFIX) for k in t)]
    for job in jobs:  # still found by its tag, from the request
        assert len(_runs_of(instance, job)) == 1
        assert job_row(db, job)["status"] == "completed"

    # A run launched without them (Launchpad, backfill) adds its jobs' tags, once each.
    late = stale_job_id(db, sandbox, "kie-veo", job_type="video")
    added.clear()
    res = (
        make_defs(media_dir)
        .resolve_job_def("reconcile_job")
        .execute_in_process(instance=instance, partition_key="kie-veo", raise_on_error=False)
    )
    assert added == [dict([job_tag(late)])]
    assert [r.run_id for r in _runs_of(instance, late)] == [res.run_id]


def test_the_story_says_attempts_left_next_attempt_lease_and_the_runs_filter(
    db, instance, media_dir, sandbox
):
    import sqlalchemy as sa

    from recon_dagster.operator.explain import explain, facts

    job = stale_job_id(db, sandbox, "kie-standard", Scenario(outcome="run_forever"), attempts=4)
    tick(make_defs(media_dir), instance)

    told = dict(facts(explain(db, instance, job)))
    assert told["attempts left"] == f"{MAX_ATTEMPTS - 5} of {MAX_ATTEMPTS}"
    assert told["next attempt"][:4].isdigit()  # a timestamp: the cadence is running
    assert told["lease"] == "-"
    key, value = job_tag(job)
    assert told["runs filter"] == f"tag {key}={value}"
    assert len(_runs_of(instance, job)) == 1

    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_lease_owner = 'run:x', "
                "reconcile_lease_expires_at = now() + interval '5 minutes' WHERE id = :j"
            ),
            {"j": str(job)},
        )
    assert dict(facts(explain(db, instance, job)))["lease"].startswith("run:x until ")


def test_provider_health_turns_red_for_the_failing_provider_from_the_runs_that_poll(
    db, instance, media_dir, sandbox
):
    for _ in range(6):
        stale_job_id(
            db, sandbox, "replicate-prediction", Scenario(polls_before_done=0, server_error_first=1000)
        )
    stale_job_id(db, sandbox, "kie-standard")

    tick(make_defs(media_dir, batch_size=10, single_run_below=2), instance)

    failed = _failed_checks(instance)
    assert ("provider_health", "replicate") in failed
    assert ("provider_health", "kie") not in failed
    passed = [
        e.dagster_event.event_specific_data.check_name
        for r in _run_ids(instance)
        for e in instance.all_logs(r, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        if e.dagster_event.event_specific_data.passed
    ]
    assert "kie" in passed
    # Idle providers (no job polled in the window) are neither red nor green: not evaluated.
    assert not {"elevenlabs", "anthropic"} & {c for _, c in failed} and not {"elevenlabs", "anthropic"} & set(
        passed
    )
    # The runs log check evaluations only: the asset's table is the health schedule's.
    assert instance.get_latest_materialization_event(dg.AssetKey("provider_health")) is None


def _latest_health_checks(instance: dg.DagsterInstance) -> dict[str, bool | None]:
    """What the console shows per provider check: its latest evaluation if Dagster counts it as one
    of provider_health's latest materialization (the UI's ``executionForLatestMaterialization``,
    decided by Dagster's own ``targets_latest_materialization``), else None: "Not evaluated"."""
    import asyncio

    from dagster._core.definitions.asset_checks.asset_check_spec import AssetCheckKey
    from dagster._core.loader import LoadingContextForTest
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecord

    from recon_dagster.core.kinds import provider_names

    async def shown(key: AssetCheckKey) -> bool | None:
        ctx = LoadingContextForTest(instance)
        record = await AssetCheckExecutionRecord.gen(ctx, key)
        if (
            record is None
            or not isinstance(record.evaluation, dg.AssetCheckEvaluation)  # skipped: only planned
            or not await record.targets_latest_materialization(ctx)
        ):
            return None
        return record.evaluation.passed

    return {p: asyncio.run(shown(AssetCheckKey(dg.AssetKey("provider_health"), p))) for p in provider_names()}


def test_a_run_of_one_provider_leaves_every_busy_providers_health_check_shown(
    db, instance, media_dir, sandbox
):
    """The console shows a check's result for the asset's latest materialization only: a KIE run
    must not turn Replicate's red check into "Not evaluated" in the middle of its outage. Idle
    providers (no job polled in the window) are left unevaluated: neither red nor green."""
    for _ in range(6):
        stale_job_id(
            db, sandbox, "replicate-prediction", Scenario(polls_before_done=0, server_error_first=1000)
        )
    tick(make_defs(media_dir, batch_size=10, single_run_below=2), instance)
    assert _latest_health_checks(instance)["replicate"] is False

    stale_job_id(db, sandbox, "kie-standard")
    with db.begin() as conn:  # only the KIE job is due now: the next run is KIE's alone
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_next_at = now() + interval '1 hour' "
                "WHERE provider_kind = 'replicate-prediction'"
            )
        )
    tick(make_defs(media_dir, batch_size=10, single_run_below=2), instance)

    shown = _latest_health_checks(instance)
    assert shown == {**dict.fromkeys(provider_names()), "replicate": False, "kie": True}, shown

    # The health schedule materializes the asset: the checks still show for its materialization,
    # the idle ones unevaluated; the run fails while replicate is DOWN (item 1 of issue 55).
    result = (
        make_defs(media_dir)
        .resolve_job_def("provider_health_job")
        .execute_in_process(instance=instance, raise_on_error=False)
    )
    assert not result.success
    assert _latest_health_checks(instance) == shown


def test_provider_health_is_materialized_at_startup_once(db, instance, media_dir):
    from recon_dagster.defs.observe.health import provider_health_at_startup

    defs = make_defs(media_dir)
    with dg.build_sensor_context(instance=instance, repository_def=defs.get_repository_def()) as ctx:
        [request] = provider_health_at_startup.evaluate_tick(ctx).run_requests
    defs.resolve_job_def("provider_health_job").execute_in_process(instance=instance)
    with dg.build_sensor_context(instance=instance, repository_def=defs.get_repository_def()) as ctx:
        assert provider_health_at_startup.evaluate_tick(ctx).run_requests == []
    assert request.run_key


@pytest.mark.slow
def test_loading_the_code_location_prints_no_dagster_beta_or_supersession_warning():
    """What `dagster dev`'s code server, every run and every sensor tick do: import the definitions."""
    import os
    import subprocess
    import sys

    code = (
        "import recon_dagster.definitions as d\n"
        "d.defs.get_repository_def().load_all_definitions()\n"
        "d.build_defs().get_repository_def().load_all_definitions()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    res = subprocess.run(
        [sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    noise = [ln for ln in res.stderr.splitlines() if "BetaWarning" in ln or "SupersessionWarning" in ln]
    assert noise == []


def test_a_failed_runs_alert_reason_is_one_line_without_dagster_internals(db, instance, media_dir, sandbox):
    from recon_dagster.defs.alerts.signals import failure_reason

    for _ in range(2):
        stale_job_id(db, sandbox, "kie-standard", Scenario(polls_before_done=0, server_error_first=1000))

    report = tick(make_defs(media_dir, single_run_below=1), instance)

    assert report.failed_runs >= 1
    [run] = [
        r for r in _run_ids(instance) if instance.get_run_by_id(r).status == dg.DagsterRunStatus.FAILURE
    ][:1]
    steps = [e.dagster_event for e in instance.all_logs(run, of_type=dg.DagsterEventType.STEP_FAILURE)]
    reason = failure_reason(steps, "Execution of run failed. Steps failed: ['outage_check'].")
    assert reason.startswith(
        "kie outage: none of the 2 job(s) of this run got an answer; each attempt was counted"
    )
    assert "\n" not in reason and "Steps failed" not in reason and "Traceback" not in reason
    # The failed step is the outage check, with the reason and the first errors as its metadata;
    # the bookkeeping before it (outcomes, health, severity) succeeded.
    [failed] = steps
    assert failed.step_key == "outage_check"
    data = failed.step_failure_data.user_failure_data
    assert data.description == reason
    assert {m for m in data.metadata} == {"errored_jobs", "first_errors", "recon/outcome"}
    assert data.metadata["recon/outcome"].value == "provider_outage"
    assert instance.get_run_by_id(run).tags["recon/outcome"] == "provider_outage"
    assert data.metadata["errored_jobs"].value == 2
    succeeded = {e.step_key for e in instance.all_logs(run, of_type=dg.DagsterEventType.STEP_SUCCESS)}
    assert "record_outcomes" in succeeded
    [run_failure] = instance.all_logs(run, of_type=dg.DagsterEventType.RUN_FAILURE)
    assert "outage_check" in run_failure.message and "record_outcomes" not in run_failure.message


def test_each_run_adds_a_point_to_its_providers_outcome_series(db, instance, media_dir, sandbox):
    from recon_dagster.defs.observe.outcomes import provider_outcomes_key

    stale_job_id(db, sandbox, "kie-standard")
    stale_job_id(db, sandbox, "kie-veo", Scenario(outcome="fail", polls_before_done=0), job_type="video")
    defs = make_defs(media_dir)
    tick(defs, instance)
    stale_job_id(db, sandbox, "kie-standard")
    tick(defs, instance)

    key = provider_outcomes_key("kie")
    events = instance.fetch_materializations(key, limit=10).records
    assert len(events) == 3  # one point per run that touched KIE
    points = [e.asset_materialization.metadata for e in events]
    # A run adds points for the kinds it worked, labelled "<kind>: <outcome> (<unit>)", never a
    # series of a kind it did not touch, nor one that is zero and never was anything else.
    assert not any(k.startswith("kie-suno:") for p in points for k in p)
    assert all(
        p["kie-standard: worked (jobs)"].value >= 1 for p in points if "kie-standard: worked (jobs)" in p
    )
    assert not [k for p in points for k, v in p.items() if v.value == 0]
    recovered, failed = "kie-standard: recovered (jobs)", "kie-veo: failed_refunded (jobs)"
    assert sum(p[recovered].value for p in points if recovered in p) == 2
    assert sum(p[failed].value for p in points if failed in p) == 1
    assert instance.fetch_materializations(provider_outcomes_key("replicate"), limit=1).records == []


def test_a_swept_job_finds_its_sweep_run_by_its_tag(db, instance, media_dir):
    user = make_user(db, sub=100, topup=50)
    swept = make_job(db, user, provider_kind="kie-standard", created_minutes_ago=181)  # never called upstream
    young = make_job(db, user, provider_kind="kie-standard", created_minutes_ago=5)
    reserve(db, swept, user, 10, from_sub=10, from_topup=0)
    reserve(db, young, user, 10, from_sub=10, from_topup=0)

    res = make_defs(media_dir).resolve_job_def("sync_sweep_job").execute_in_process(instance=instance)

    assert job_row(db, swept)["status"] == "failed"
    assert [r.run_id for r in _runs_of(instance, swept)] == [res.run_id]
    assert _runs_of(instance, young) == []  # not swept: not tagged


def _row_tags(tags: dict[str, str]) -> set[str]:
    """The tags the Dagster 1.13 runs list prints on a run's row: never a hidden key
    (``.dagster/``); of Dagster's own (``dagster/``), only the partition and the backfill."""
    return {
        k
        for k in tags
        if not k.startswith(".dagster/")
        and (not k.startswith("dagster/") or k in ("dagster/partition", "dagster/backfill"))
    }


def test_a_reconcile_runs_row_shows_only_what_the_run_queue_limits_by(db, instance, media_dir, sandbox):
    import yaml

    from recon_dagster.core.paths import project_root

    single = stale_job_id(db, sandbox, "kie-standard")
    batch = [stale_job_id(db, sandbox, "replicate-prediction") for _ in range(4)]
    tick(make_defs(media_dir, single_run_below=2), instance)

    runs = {r.tags["recon/provider_kind"]: r for r in instance.get_runs()}
    limited = {
        x["key"]
        for x in yaml.safe_load((project_root() / "dagster.yaml").read_text())["run_queue"][
            "tag_concurrency_limits"
        ]
    }
    for kind, jobs in (("kie-standard", [single]), ("replicate-prediction", batch)):
        run = runs[kind]
        shown = _row_tags(run.tags) - {"recon/trigger"}  # reconcile --once marks its runs
        assert shown == {*limited, "dagster/partition"}, sorted(shown)
        assert len(shown) == 4
        assert {str(j) for j in jobs} <= {k.removeprefix(".dagster/recon-job-") for k in run.tags}


def test_the_outcome_assets_say_every_reconcile_run_writes_them_and_nothing_automates_them():
    from recon_dagster.definitions import defs
    from recon_dagster.defs.observe.outcomes import OUTCOMES, provider_outcomes_key

    repo = defs.get_repository_def()
    graph = repo.asset_graph
    keys = [OUTCOMES, *(provider_outcomes_key(p) for p in {k.provider for k in KINDS.values()})]
    for key in keys:
        node = graph.get(key)
        assert node.description.startswith("Written by every reconcile_job and sync_sweep_job run"), key
        assert node.metadata["written_by"] == "reconcile_job, sync_sweep_job"
        assert node.kinds == {"postgres"} and node.group_name == "reconciliation"
        # The Automation section shows this label instead of "No automations found" ...
        assert (
            node.automation_condition.get_label() == "written by every reconcile_job and sync_sweep_job run"
        )
    # ... and it is only a label: Dagster evaluates conditions of executable assets only, so no
    # automation sensor exists to request a run of these.
    assert not any(isinstance(s, dg.AutomationConditionSensorDefinition) for s in repo.sensor_defs)
    assert {s.name for s in repo.sensor_defs} == {
        "stale_inflight_jobs_sensor",
        "release_failed_run_leases",
        "fail_vanished_runs",
        "reconcile_alerts",
        "provider_health_at_startup",
    }
