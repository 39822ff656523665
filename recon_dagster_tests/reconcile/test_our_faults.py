"""Our own faults never cost a job an attempt (issue 48, item 4).

A media store the run worker cannot write, a database blip and our configuration are failures of
ours, not the job's: no attempt counted, nothing refunded, the job due again after a cadence, and
a loud signal of our own (the run fails with one line, ``no_faults_of_ours`` turns red). A run that
dies on a database blip gives its leases back at once, so its jobs are retaken at the next tick,
not after the whole lease.

The media store "not writable by the run worker" is a folder path whose parent is a regular file:
the tests run as root, which no permission bit stops, and this fails the same call (the store's
``put_stream``) with the same ``OSError`` family a read-only volume does.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.definitions import build_defs
from recon_dagster.defs.resources import DatabaseResource, ReconcileSettingsResource
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile import reconciler as reconciler_module
from recon_dagster_tests.support.factories import job_row, make_user, sql
from recon_dagster_tests.support.reconcile import finished_kie_job, tick, usage_status

pytestmark = pytest.mark.postgres

CAP = 18


def _defs(media_dir: str) -> dg.Definitions:
    return build_defs(
        {
            "providers": providers_from_env(),
            "media_store": LocalMediaStore(base_dir=media_dir),
            "reconcile_settings": ReconcileSettingsResource(max_attempts=CAP),
        }
    )


def _unwritable(tmp_path: Path) -> str:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the media folder's parent should be")
    return str(blocker / "media")


def _due_now(db: sa.Engine, job: uuid.UUID) -> None:
    sql(db, "UPDATE jobs SET reconcile_next_at = now() - interval '1 second' WHERE id = :j", j=str(job))


def _check(instance: dg.DagsterInstance, name: str) -> list[bool]:
    """Every evaluation of ``name`` this instance recorded, oldest first (passed or not)."""
    out = []
    for record in instance.get_event_records(
        dg.EventRecordsFilter(event_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION), ascending=True
    ):
        data = record.event_log_entry.dagster_event.event_specific_data
        if data.check_name == name:
            out.append(bool(data.passed))
    return out


def test_an_unwritable_media_store_never_costs_the_job_an_attempt_nor_refunds_it(
    db, sandbox, media_dir, tmp_path, instance
) -> None:
    user = make_user(db)
    # One attempt left before the cap: on a counted attempt this tick would force-fail and refund
    # a result the provider had finished.
    job, _ = finished_kie_job(db, sandbox, user)
    sql(db, "UPDATE jobs SET reconcile_attempts = :n WHERE id = :j", n=CAP - 1, j=str(job))

    report = tick(_defs(_unwritable(tmp_path)), instance)

    row = job_row(db, job)
    assert row["status"] == "processing" and row["reconcile_attempts"] == CAP - 1, row["reconcile_last_error"]
    assert usage_status(db, job) == "reserved"
    assert row["reconcile_lease_owner"] is None  # released: due again after a cadence
    # Loud, in one line: the run fails naming our storage, and our own check is red.
    assert report.failed_runs == 1
    assert _check(instance, "no_faults_of_ours") == [False]
    with db.connect() as conn:
        detail = conn.execute(
            sa.text("SELECT detail FROM reconcile_events WHERE job_id = :j ORDER BY id DESC LIMIT 1"),
            {"j": str(job)},
        ).scalar_one()
    assert detail.startswith("our_storage: ") and "no attempt counted" in detail
    # explain shows it as no attempt (no number), and why.
    from recon_dagster.operator.explain import load_story, to_text

    text = to_text(load_story(db, job), None)
    assert "1 stopped by a fault of ours (not counted)" in text and "#-   our_fault" in text
    # The run's own line for the job says no attempt was counted, never "attempt <n>".
    lines = [
        line
        for run in instance.get_runs(filters=dg.RunsFilter(job_name="reconcile_job"))
        for entry in instance.all_logs(run.run_id)
        for line in (entry.user_message or "").splitlines()
        if line.startswith(f"job {job} ")
    ]
    assert lines and all(" no attempt counted: our_fault - " in line for line in lines), lines

    # The folder fixed: the next attempt completes the job, charged once.
    _due_now(db, job)
    tick(_defs(media_dir), instance)
    assert job_row(db, job)["status"] == "completed"
    assert usage_status(db, job) == "committed"


def test_a_database_blip_while_settling_counts_no_attempt(
    db, sandbox, media_dir, instance, monkeypatch
) -> None:
    user = make_user(db)
    job, _ = finished_kie_job(db, sandbox, user)
    sql(db, "UPDATE jobs SET reconcile_attempts = :n WHERE id = :j", n=CAP - 1, j=str(job))
    real = reconciler_module.finalize_job_with_media

    def blip(*args, **kwargs):
        raise sa.exc.OperationalError(
            "UPDATE jobs", {}, Exception("server closed the connection unexpectedly")
        )

    monkeypatch.setattr(reconciler_module, "finalize_job_with_media", blip)
    tick(_defs(media_dir), instance)
    row = job_row(db, job)
    assert row["status"] == "processing" and row["reconcile_attempts"] == CAP - 1, row["reconcile_last_error"]
    assert usage_status(db, job) == "reserved"

    monkeypatch.setattr(reconciler_module, "finalize_job_with_media", real)
    _due_now(db, job)
    tick(_defs(media_dir), instance)
    assert job_row(db, job)["status"] == "completed" and usage_status(db, job) == "committed"


def test_a_run_that_dies_on_a_database_blip_gives_its_leases_back(
    db, sandbox, media_dir, instance, monkeypatch
) -> None:
    from recon_dagster.defs.reconcile.failed_runs import release_failed_run_leases

    user = make_user(db)
    job, _ = finished_kie_job(db, sandbox, user)
    real = reconciler_module.Reconciler.act

    def dies(self, polled, owner):  # the database goes away between the poll and the act phase
        raise sa.exc.OperationalError(
            "UPDATE jobs", {}, Exception("terminating connection due to administrator command")
        )

    monkeypatch.setattr(reconciler_module.Reconciler, "act", dies)
    report = tick(_defs(media_dir), instance)
    assert report.failed_runs == 1
    row = job_row(db, job)
    assert row["reconcile_lease_owner"] is not None  # the dead run still holds it

    failed = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
    assert len(failed) == 1
    event = next(
        iter(instance.all_logs(failed[0].run_id, of_type=dg.DagsterEventType.RUN_FAILURE))
    ).dagster_event
    context = dg.build_run_status_sensor_context(
        sensor_name=release_failed_run_leases.name,
        dagster_event=event,
        dagster_instance=instance,
        dagster_run=failed[0],
        resources={"database": DatabaseResource(), "reconcile_settings": ReconcileSettingsResource()},
    ).for_run_failure()
    release_failed_run_leases(context)

    row = job_row(db, job)
    assert row["reconcile_lease_owner"] is None and row["reconcile_attempts"] == 0
    assert usage_status(db, job) == "reserved"
    # Retaken at the next tick (no waiting out the lease), under a fresh run key: completed once.
    monkeypatch.setattr(reconciler_module.Reconciler, "act", real)
    tick(_defs(media_dir), instance)
    assert job_row(db, job)["status"] == "completed" and usage_status(db, job) == "committed"
