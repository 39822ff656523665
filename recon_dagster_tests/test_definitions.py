"""The code location loads, validates, and has the shape the design card fixes."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg

from recon_dagster.definitions import defs
from recon_dagster.kinds import KIND_NAMES


def test_definitions_load_with_every_job_sensor_and_schedule():
    repo = defs.get_repository_def()
    assert {j.name for j in repo.get_all_jobs()} >= {
        "reconcile_job",
        "sync_sweep_job",
        "reconcile_health_job",
        "lora_training_migration_job",
    }
    assert {s.name for s in repo.sensor_defs} == {"stale_inflight_jobs_sensor", "reconcile_run_failure_alert"}
    assert {s.name for s in repo.schedule_defs} == {
        "sync_sweep_schedule",
        "reconcile_health_schedule",
        "lora_training_migration_schedule",
    }
    assert set(defs.resources) == {"database", "providers", "media_store", "reconcile_settings", "handoff_io_manager"}


def test_reconcile_job_is_partitioned_by_every_provider_kind_and_runs_in_process():
    job = defs.resolve_job_def("reconcile_job")
    assert job.partitions_def is not None
    assert list(job.partitions_def.get_partition_keys()) == list(KIND_NAMES)
    assert job.executor_def.name == dg.in_process_executor.name


def test_sensor_is_on_by_default():
    sensor = defs.resolve_sensor_def("stale_inflight_jobs_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert sensor.job_name == "reconcile_job"


def test_secrets_are_env_vars_not_literals():
    providers = defs.resources["providers"]
    for name in ("kie", "replicate", "elevenlabs", "anthropic"):
        key = getattr(providers, name).api_key
        assert isinstance(key, dg.EnvVar), f"{name}.api_key must come from dg.EnvVar"


def test_dagster_definitions_validate_passes(tmp_path):
    env = dict(os.environ)
    env["DAGSTER_HOME"] = str(tmp_path)
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    out = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-m", "recon_dagster.definitions"],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Validation successful" in out.stdout + out.stderr
