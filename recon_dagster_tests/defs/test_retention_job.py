"""prune_history on a real Dagster instance: our runs past their age go through the instance API
(failed and outcome-tagged runs kept longer, other code locations' never), and the tables' pass
keeps every row since an open alert incident."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import dagster as dg
import sqlalchemy as sa

from recon_dagster.core.runtags import OUTCOME_TAG
from recon_dagster.defs.retention.incidents import open_incidents_since
from recon_dagster.defs.retention.runs import REPOSITORY_LABEL_TAG, prune_runs
from recon_dagster_tests.support.factories import make_job, make_user, sql
from recon_dagster_tests.support.reconcile import make_defs
from recon_dagster_tests.support.retention import add_run, set_alert_cursor

S, F, R = dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.STARTED
OURS = "repo@recon_dagster"


def _prune(instance: dg.DagsterInstance, days_later: float, **kw: object) -> object:
    """A pass as it would run ``days_later`` days from now (run storage stamps runs with now)."""
    args: dict[str, object] = {"days": 30, "failed_days": 90, "our_label": OURS, "max_runs": 1000, **kw}
    return prune_runs(
        instance,
        ["reconcile_job", "sync_sweep_job"],
        now=datetime.now(UTC) + timedelta(days=days_later),
        **args,
    )  # type: ignore[arg-type]


def _left(instance: dg.DagsterInstance, *run_ids: str) -> list[bool]:
    return [instance.get_run_by_id(r) is not None for r in run_ids]


def test_our_finished_runs_go_after_their_age_and_failed_ones_later(instance: dg.DagsterInstance) -> None:
    ok = add_run(instance, "reconcile_job", S, {REPOSITORY_LABEL_TAG: OURS})
    failed = add_run(instance, "reconcile_job", F, {REPOSITORY_LABEL_TAG: OURS})
    refunded = add_run(instance, "sync_sweep_job", S, {OUTCOME_TAG: "refunded_at_cap"})
    running = add_run(instance, "reconcile_job", R)
    assert _prune(instance, 10).deleted == 0  # type: ignore[attr-defined]
    report = _prune(instance, 31)
    assert report.deleted == 1 and report.kept_outcome == 1  # type: ignore[attr-defined]
    assert _left(instance, ok, failed, refunded, running) == [False, True, True, True]
    assert not list(instance.all_logs(ok))  # its event log went with it
    _prune(instance, 91)
    assert _left(instance, failed, refunded, running) == [False, False, True]


def test_runs_of_other_code_locations_and_other_jobs_are_never_touched(instance: dg.DagsterInstance) -> None:
    """Shared run storage: another location's job of the same name, and jobs that are not ours."""
    theirs = add_run(instance, "reconcile_job", S, {REPOSITORY_LABEL_TAG: "repo@billing"})
    other_job = add_run(instance, "nightly_etl", S, {REPOSITORY_LABEL_TAG: "repo@billing"})
    ours = add_run(instance, "reconcile_job", S, {REPOSITORY_LABEL_TAG: OURS})
    report = _prune(instance, 400)
    assert _left(instance, theirs, other_job, ours) == [True, True, False]
    assert report.kept_other_location == 1  # type: ignore[attr-defined]


def test_a_pass_deletes_at_most_its_limit(instance: dg.DagsterInstance) -> None:
    runs = [add_run(instance, "reconcile_job", S) for _ in range(5)]
    report = _prune(instance, 31, max_runs=3)
    assert report.deleted == 3 and not report.finished  # type: ignore[attr-defined]
    assert sum(_left(instance, *runs)) == 2


def test_open_incidents_are_read_from_the_alert_sensors_cursor(instance: dg.DagsterInstance) -> None:
    assert open_incidents_since(instance) == (None, [])
    opened = time.time() - 5 * 86_400
    set_alert_cursor(
        instance, {"open": {"check:provider_health:kie": {"since": opened}, "runs:x": {"since": opened + 60}}}
    )
    since, keys = open_incidents_since(instance)
    assert since == datetime.fromtimestamp(opened, UTC)
    assert keys == ["check:provider_health:kie", "runs:x"]


def test_prune_history_keeps_rows_since_an_open_incident(
    db: sa.Engine, instance: dg.DagsterInstance, media_dir: str, monkeypatch
) -> None:
    """The whole job in-process: with RECON_RETENTION_EVENTS_DAYS=7, an attempt 20 days old goes
    and one 10 days old stays while an incident opened 12 days ago is open; after it resolves
    that one goes too. An old run of ours goes as well."""
    from recon_dagster.config import Settings

    monkeypatch.setenv(Settings.retention_events_days.name, "7")
    user = make_user(db)
    job = make_job(db, user, status="completed", provider_kind="kie-standard")
    for attempt, days in ((1, 20), (2, 10)):
        sql(
            db,
            "INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome, created_at) "
            "VALUES (:j, 'kie-standard', :a, 'failed', now() - make_interval(days => :d))",
            j=str(job), a=attempt, d=days,
        )  # fmt: skip
    set_alert_cursor(instance, {"open": {"check:x": {"since": time.time() - 12 * 86_400}}})
    defs = make_defs(media_dir)
    assert defs.resolve_job_def("prune_history").execute_in_process(instance=instance).success
    with db.connect() as conn:
        left = conn.execute(
            sa.text("SELECT attempt FROM reconcile_events WHERE job_id = :j"), {"j": str(job)}
        )
        assert left.scalars().all() == [2]
    set_alert_cursor(instance, {"open": {}})
    assert defs.resolve_job_def("prune_history").execute_in_process(instance=instance).success
    with db.connect() as conn:
        n = conn.execute(sa.text("SELECT count(*) FROM reconcile_events WHERE job_id = :j"), {"j": str(job)})
        assert n.scalar_one() == 0


def test_the_shipped_tick_retention_is_what_dagster_reads_and_the_same_everywhere() -> None:
    """dagster.yaml's ``retention:`` is accepted by Dagster and purges skipped sensor ticks after
    a day; the Kubernetes instance file and the Helm values say the same."""
    from pathlib import Path

    import yaml
    from dagster._core.scheduler.instigation import InstigatorType, TickStatus

    root = Path(__file__).resolve().parents[2]
    shipped = yaml.safe_load((root / "dagster.yaml").read_text())["retention"]
    k8s = yaml.safe_load((root / "deploy" / "dagster-k8s.yaml").read_text())["retention"]
    helm = yaml.safe_load((root / "deploy" / "helm" / "values.yaml").read_text())["retention"]
    assert k8s == shipped
    assert helm["enabled"] is True
    for kind in ("schedule", "sensor"):
        assert helm[kind]["purgeAfterDays"] == shipped[kind]["purge_after_days"]
    with dg.instance_for_test(overrides={"retention": shipped}) as instance:
        sensor = instance.get_tick_retention_settings(InstigatorType.SENSOR)
        schedule = instance.get_tick_retention_settings(InstigatorType.SCHEDULE)
    assert sensor[TickStatus.SKIPPED] == 1 and sensor[TickStatus.FAILURE] == 30
    assert schedule[TickStatus.SKIPPED] == 7
