"""The code location loads, validates, and has the shape the design card fixes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from recon_dagster.core.kinds import KIND_NAMES
from recon_dagster.definitions import defs


def test_definitions_load_with_every_job_sensor_and_schedule():
    repo = defs.get_repository_def()
    assert {j.name for j in repo.get_all_jobs()} >= {
        "reconcile_job",
        "sync_sweep_job",
        "reconcile_health_job",
        "lora_training_migration_job",
        "plan_reconcile",
        "shadow_agreement_job",
        "orphan_sweep_job",
        "prune_history",
    }
    assert {s.name for s in repo.sensor_defs} == {
        "stale_inflight_jobs_sensor",
        "release_failed_run_leases",
        "fail_vanished_runs",
        "reconcile_alerts",
        "provider_health_at_startup",
    }
    assert {s.name for s in repo.schedule_defs} == {
        "sync_sweep_schedule",
        "reconcile_health_schedule",
        "lora_training_migration_schedule",
        "shadow_agreement_schedule",
        "orphan_sweep_schedule",
        "spend_reconciliation_schedule",
        "anthropic_spend_hourly_schedule",
        "prune_history_schedule",
    }
    assert set(defs.resources) >= {
        "database",
        "providers",
        "media_store",
        "reconcile_settings",
        "handoff_io_manager",
        "alert_targets",
    }


def test_reconcile_job_is_partitioned_by_every_provider_kind_and_runs_in_process():
    job = defs.resolve_job_def("reconcile_job")
    assert job.partitions_def is not None
    assert list(job.partitions_def.get_partition_keys()) == list(KIND_NAMES)
    assert job.executor_def.name == dg.in_process_executor.name


def test_sensor_is_on_by_default():
    sensor = defs.resolve_sensor_def("stale_inflight_jobs_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert sensor.job_name == "reconcile_job"


def _with_every_key(monkeypatch: pytest.MonkeyPatch) -> dg.Definitions:
    """The definitions with every provider's key set (a provider without its key is not wired)."""
    from recon_dagster.definitions import build_defs
    from recon_dagster.providers.resource import api_key_env_vars

    for env in api_key_env_vars():
        monkeypatch.setenv(env, "k")
    return build_defs()


def test_secrets_are_env_vars_not_literals(monkeypatch):
    from recon_dagster.core.kinds import provider_specs

    providers = _with_every_key(monkeypatch).resources["providers"]
    for spec in provider_specs():
        key = getattr(providers, spec.name).api_key
        assert isinstance(key, dg.EnvVar), f"{spec.name}.api_key must come from dg.EnvVar"


@pytest.mark.slow
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


def _all_definitions() -> list[tuple[str, str, str | None]]:
    """(what, name, description) of every job, sensor, schedule, asset and asset check."""
    repo = defs.get_repository_def()
    found: list[tuple[str, str, str | None]] = []
    found += [("job", j.name, j.description) for j in repo.get_all_jobs() if not j.name.startswith("__")]
    found += [("sensor", s.name, s.description) for s in repo.sensor_defs]
    found += [("schedule", s.name, s.description) for s in repo.schedule_defs]
    for assets_def in repo.asset_graph.assets_defs:
        for key in assets_def.keys:
            found.append(("asset", key.to_user_string(), assets_def.descriptions_by_key.get(key)))
        for spec in assets_def.check_specs:
            found.append(("asset check", spec.name, spec.description))
    return found


def test_every_job_sensor_schedule_asset_and_check_has_a_description():
    found = _all_definitions()
    kinds = {what for what, _, _ in found}
    assert kinds == {"job", "sensor", "schedule", "asset", "asset check"}, kinds
    missing = [f"{what} {name}" for what, name, desc in found if not (desc or "").strip()]
    assert not missing, f"no description: {missing}"


def test_lora_cohort_check_states_its_minimum_cohort():
    [desc] = [d for what, name, d in _all_definitions() if name == "lora_cohort_matches_legacy"]
    assert desc and "20 compared" in desc and "0 mismatches" in desc and "0 orphans" in desc


def _workspace_location(argv: list[str]) -> tuple[str, str]:
    import yaml

    assert "-m" not in argv[argv.index("dev") :], (
        f"dagster dev -m names the location after the module: {argv}"
    )
    workspace = argv[argv.index("-w") + 1]
    [entry] = yaml.safe_load(Path(workspace).read_text())["load_from"]
    return entry["python_module"]["module_name"], entry["python_module"]["location_name"]


def test_recon_dagster_dev_serves_the_location_as_recon_dagster(engine, tmp_path, monkeypatch):
    from recon_dagster.cli import main, proctree

    calls: list[list[str]] = []
    # `dev` runs dagster dev as a process tree it stops whole on SIGTERM (recon_dagster.cli.proctree).
    monkeypatch.setattr(proctree, "run_process_tree", lambda cmd, *a, **kw: calls.append(list(cmd)) or 0)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    assert main(["dev", "--", "-p", "3999"]) == 0
    [argv] = calls
    assert argv[-2:] == ["-p", "3999"]
    assert _workspace_location(argv) == ("recon_dagster.definitions", "recon_dagster")


def test_demo_serve_starts_dagster_dev_on_the_location_recon_dagster(db, tmp_path, monkeypatch):
    from recon_dagster.cli import demo
    from recon_dagster.cli.demo import run_demo

    calls: list[list[str]] = []
    monkeypatch.setattr(demo, "run_process_tree", lambda cmd, *a, **kw: calls.append(list(cmd)) or 0)
    monkeypatch.chdir(tmp_path)
    saved = dict(os.environ)  # the demo points os.environ at its sandbox and instance
    os.environ["DAGSTER_HOME"] = str(tmp_path)  # no dagster.yaml: a local instance, nothing left behind
    os.environ["RECON_MEDIA_DIR"] = str(tmp_path / "media")
    try:
        assert run_demo(serve=True) == 0
    finally:
        os.environ.clear()
        os.environ.update(saved)
    [argv] = calls
    assert _workspace_location(argv) == ("recon_dagster.definitions", "recon_dagster")


def _nested_resource_links(d: dg.Definitions) -> dict[str, str]:
    """What the UI's resource pages get: ``parent.attribute -> TOP_LEVEL or ANONYMOUS``."""
    from dagster._core.remote_representation.external_data import RepositorySnap

    snap = RepositorySnap.from_def(d.get_repository_def())
    return {
        f"{r.name}.{attr}": f"{n.type.value}:{n.name}"
        for r in snap.resources
        for attr, n in r.nested_resources.items()
    }


def test_every_nested_resource_has_a_page_of_its_own(monkeypatch):
    # The UI links providers.kie to /resources/kie; only a top-level resource named after the
    # attribute has that page ("Could not load resource" otherwise). Same rule for the S3 store.
    from recon_dagster.core.kinds import provider_names
    from recon_dagster.definitions import build_defs

    keyed = _with_every_key(monkeypatch)
    links = _nested_resource_links(keyed)
    wired = {r.PROVIDER for r in keyed.resources["providers"].configured()}
    assert wired == set(provider_names())  # each provider is wired when its key is set
    assert {k for k in links if k.startswith("providers.")} == {f"providers.{p}" for p in wired}
    monkeypatch.setenv("RECON_S3_BUCKET", "media")
    from recon_dagster.media.store import media_store_from_env

    links.update(_nested_resource_links(build_defs({"media_store": media_store_from_env()})))
    assert any(k.startswith("media_store.") for k in links), links
    bad = {k: v for k, v in links.items() if v != f"TOP_LEVEL:{k.split('.', 1)[1]}"}
    assert not bad, f"nested resources without a page of their own: {bad}"
    providers = keyed.resources["providers"]
    assert keyed.resources["kie"] is providers.kie, "the page must show the very resource the runs use"


def test_the_module_dagster_loads_holds_exactly_one_definitions_object():
    # workspace.yaml and pyproject name the module (python_module: recon_dagster.definitions);
    # Dagster's loader refuses a module with several Definitions objects at its top level, which
    # broke the daemon (the benchmarks' and daemon tests' code server) after the restructure.
    from dagster._core.workspace.autodiscovery import loadable_targets_from_python_module

    targets = loadable_targets_from_python_module("recon_dagster.definitions", None)
    assert [t.attribute for t in targets] == ["defs"]
