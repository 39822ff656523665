"""In shadow, nothing recon_dagster defines changes an app table.

The test enumerates the definitions themselves, so a job, schedule or sensor added later is
covered without editing it: every job is launched (each partition of a partitioned job, every
asset of the implicit asset job, an operator job once per seeded job, its config filled from its
own schema), every schedule and every sensor is evaluated and the runs they ask for are executed,
the run-failure sensor is given a failed run. The world is every situation reconciliation meets,
plus a legacy LoRA training and rows whose lease or next attempt no write of ours could have set.
Before and after, a digest of every app table (migration 001's) must be equal.

A mixed rollout (some kinds enforced, the others shadowed) is below: the sweep clamps an
enforced job's impossible lease and records a shadowed job's as a decision.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster_tests.conftest import APP_TABLES
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import make_defs, one
from recon_dagster_tests.support.world import fingerprint, seed_world

pytestmark = pytest.mark.timeout(600)

# Values for config fields the definitions ask for by name; a required field not here fails the
# test with its path, so a new job's config is a one-line addition, never a silent skip.
KNOWN_FIELDS: dict[str, Any] = {
    "reason": "shadow probe",
    "operator": "shadow-probe",
    "kind": None,
    "no_poll": False,
}


def _legacy_training(db: sa.Engine, sandbox: Any) -> uuid.UUID:
    from recon_dagster.sandbox import Scenario

    user = make_user(db)
    training = sandbox.add_task("replicate-training", Scenario(polls_before_done=0))
    job = make_job(db, user, job_type="lora-training", created_minutes_ago=300)
    reserve(db, job, user, 40)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO characters (user_id, name, training_status, replicate_training_id, training_job_id, "
                "training_started_at) VALUES (:u, 'c', 'training', :t, :j, now() - interval '4 hours')"
            ),
            {"u": str(user), "t": training, "j": str(job)},
        )
    return job


def _impossible_waits(db: sa.Engine, sandbox: Any) -> dict[str, uuid.UUID]:
    """Rows no write of ours could have left: a lease until infinity, a next attempt in a year."""
    from recon_dagster.sandbox import Scenario

    user = make_user(db)
    out = {}
    for name, kind, column, value in (
        ("lease_forever", "kie-standard", "reconcile_lease_expires_at", "infinity"),
        ("next_in_a_year", "replicate-prediction", "reconcile_next_at", "now() + interval '1 year'"),
        ("veo_lease_forever", "kie-veo", "reconcile_lease_expires_at", "infinity"),
    ):
        task = sandbox.add_task(kind, Scenario(polls_before_done=0))
        job = make_job(db, user, provider_kind=kind, provider_task_id=task, started_minutes_ago=600)
        reserve(db, job, user, 5)
        literal = f"'{value}'" if value == "infinity" else value
        with db.begin() as conn:
            conn.execute(
                sa.text(
                    f"UPDATE jobs SET {column} = {literal}, reconcile_lease_owner = 'ghost' WHERE id = :j"
                ),
                {"j": str(job)},
            )
        out[name] = job
    return out


def _fill(config_type: Any, path: str, job_id: str) -> Any:
    """A value for a required config entry: its known fields filled, the rest left to defaults."""
    fields = getattr(config_type, "fields", None)
    if fields is None:
        raise AssertionError(f"{path}: no value known for this required config; add it to KNOWN_FIELDS")
    out: dict[str, Any] = {}
    for name, field in fields.items():
        if name == "job_id":
            out[name] = job_id
        elif name in KNOWN_FIELDS:
            if KNOWN_FIELDS[name] is not None or field.is_required:
                out[name] = KNOWN_FIELDS[name]
        elif field.is_required:
            out[name] = _fill(field.config_type, f"{path}.{name}", job_id)
    return out


def _needs_a_job_id(job: dg.JobDefinition) -> bool:
    """Whether any op of ``job`` takes a ``job_id`` (an operator's or explain's job)."""
    seen: list[str] = []

    def walk(t: Any) -> None:
        for name, field in (getattr(t, "fields", None) or {}).items():
            seen.append(name)
            walk(field.config_type)

    walk(job.run_config_schema.config_type)
    return "job_id" in seen


def _launch_every_job(defs: dg.Definitions, instance: dg.DagsterInstance, job_ids: list[str]) -> set[str]:
    """Every job of the definitions, launched the ways it can be; returns the names launched."""
    repo = defs.get_repository_def()
    launched: set[str] = set()
    for job in repo.get_all_jobs():
        runs: list[dict[str, Any]] = []
        if job.name.startswith("__ASSET_JOB"):
            keys = sorted(job.asset_layer.executable_asset_keys, key=str)
            runs = [{"asset_selection": [k]} for k in keys]
        elif isinstance(job.partitions_def, dg.TimeWindowPartitionsDefinition):
            # A day or an hour is like any other: the latest two, not every one since the start.
            runs = [{"partition_key": k} for k in job.partitions_def.get_partition_keys()[-2:]]
        elif job.partitions_def is not None:
            runs = [{"partition_key": k} for k in job.partitions_def.get_partition_keys()]
        elif _needs_a_job_id(job):
            runs = [{"run_config": _fill(job.run_config_schema.config_type, job.name, j)} for j in job_ids]
        else:
            runs = [{"run_config": _fill(job.run_config_schema.config_type, job.name, job_ids[0])}]
        for kwargs in runs:
            job.execute_in_process(instance=instance, raise_on_error=False, **kwargs)
        launched.add(job.name)
    return launched


def _execute(
    defs: dg.Definitions, instance: dg.DagsterInstance, requests: list, default_job: str | None
) -> None:
    for rr in requests or []:
        job = defs.resolve_job_def(rr.job_name or default_job)
        job.execute_in_process(
            instance=instance, run_config=rr.run_config, partition_key=rr.partition_key,
            tags={**rr.tags, **({"dagster/run_key": rr.run_key} if rr.run_key else {})}, raise_on_error=False,
        )  # fmt: skip


def _tick_every_schedule_and_sensor(defs: dg.Definitions, instance: dg.DagsterInstance) -> set[str]:
    repo = defs.get_repository_def()
    seen: set[str] = set()
    for schedule in repo.schedule_defs:
        resources = {k: defs.resources[k] for k in schedule.required_resource_keys}  # type: ignore[index]
        # As the daemon ticks it: at a scheduled time.
        with dg.build_schedule_context(
            instance=instance,
            resources=resources,
            repository_def=repo,
            scheduled_execution_time=datetime.now(UTC),
        ) as ctx:
            data = schedule.evaluate_tick(ctx)
        _execute(defs, instance, data.run_requests, schedule.job_name)
        seen.add(schedule.name)
    for sensor in repo.sensor_defs:
        if isinstance(sensor, dg.RunStatusSensorDefinition):
            [failed] = instance.get_runs(
                filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]), limit=1
            )
            [event] = instance.all_logs(failed.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
            resources = {k: defs.resources[k] for k in sensor.required_resource_keys}  # type: ignore[index]
            ctx = dg.build_run_status_sensor_context(
                sensor_name=sensor.name, dagster_event=event.dagster_event, dagster_instance=instance,
                dagster_run=failed, repository_def=repo, resources=resources,
            ).for_run_failure()  # fmt: skip
            sensor(ctx)
        else:
            resources = {k: defs.resources[k] for k in sensor.required_resource_keys}  # type: ignore[index]
            with dg.build_sensor_context(
                instance=instance, resources=resources, repository_def=repo, sensor_name=sensor.name
            ) as ctx:
                data = sensor.evaluate_tick(ctx)
            jobs = [t.job_name for t in sensor.targets] if sensor.has_jobs else [None]
            _execute(defs, instance, data.run_requests, jobs[0])
        seen.add(sensor.name)
    return seen


def test_in_shadow_no_job_schedule_or_sensor_changes_an_app_table(
    db, sandbox, media_dir, instance, monkeypatch
):
    monkeypatch.setenv("RECON_MODE", "shadow")
    world = seed_world(db, sandbox)
    world["legacy_training"] = _legacy_training(db, sandbox)
    world.update(_impossible_waits(db, sandbox))
    defs = make_defs(media_dir)
    skip = frozenset(_tables(db)) - frozenset(APP_TABLES)
    before = fingerprint(db, media_dir, skip=skip)

    # Jobs that take a job id run once per job of a different kind or state (every mode path:
    # async kinds of three providers, a sync kind, no kind, a legacy training, one at its cap).
    ids = [
        str(world[n])
        for n in (
            "complete",
            "complete_twice_reserved",
            "sweep_sync",
            "sweep_legacy",
            "legacy_training",
            "force_fail",
        )
    ]
    launched = _launch_every_job(defs, instance, ids)
    ticked = _tick_every_schedule_and_sensor(defs, instance)

    repo = defs.get_repository_def()
    assert launched == {j.name for j in repo.get_all_jobs()}
    assert ticked == {s.name for s in repo.schedule_defs} | {s.name for s in repo.sensor_defs}
    after = fingerprint(db, media_dir, skip=skip)
    changed = sorted(t for t in before if before[t] != after[t])
    assert changed == [], f"shadow changed {changed}"  # today: jobs (the LoRA cohort adopted)
    # It did decide: shadow is not silent, it records instead of acting.
    assert one(db, "SELECT count(*) FROM reconcile_decisions") > 0


def _tables(db: sa.Engine) -> list[str]:
    with db.connect() as conn:
        return list(
            conn.execute(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars()
        )


# -- a mixed rollout clamps its enforced kinds ------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {"RECON_SHADOW_KINDS": "kie-veo"},  # rollout.md's mixed setup: enforce all, shadow one kind
        {"RECON_MODE": "shadow", "RECON_ENFORCE_KINDS": "kie-standard,replicate-prediction"},
    ],
    ids=["shadow_one_kind", "enforce_two_kinds"],
)
def test_with_a_kind_shadowed_the_sweep_still_clamps_enforced_kinds_and_decides_the_shadowed_clamp(
    db, sandbox, media_dir, instance, monkeypatch, env: dict[str, str]
) -> None:
    from recon_dagster_tests.support.reconcile import tick

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    jobs = _impossible_waits(db, sandbox)

    tick(make_defs(media_dir), instance, sweep=True)

    for name in ("lease_forever", "next_in_a_year"):  # enforced: clamped, with an anomaly each
        lease_s = one(
            db,
            "SELECT EXTRACT(EPOCH FROM GREATEST(reconcile_lease_expires_at, reconcile_next_at) - now()) "
            "FROM jobs WHERE id = :j",
            j=jobs[name],
        )
        assert lease_s is not None and float(lease_s) <= 900 + 5, (name, lease_s)  # today: untouched
        assert one(db, "SELECT count(*) FROM credit_anomalies WHERE job_id = :j", j=jobs[name]) == 1
    # Shadowed: not written (its lease still runs to infinity), no anomaly; a clamp decision instead.
    assert one(
        db,
        "SELECT reconcile_lease_expires_at = 'infinity' FROM jobs WHERE id = :j",
        j=jobs["veo_lease_forever"],
    )
    assert (
        one(db, "SELECT count(*) FROM credit_anomalies WHERE job_id = :j", j=jobs["veo_lease_forever"]) == 0
    )
    action, reason = one(
        db,
        "SELECT array[action, reason] FROM reconcile_decisions WHERE job_id = :j",
        j=jobs["veo_lease_forever"],
    )
    assert action == "clamp" and "lease_beyond_ttl" in reason
