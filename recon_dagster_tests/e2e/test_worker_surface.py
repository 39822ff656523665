"""The import paths the README gives the app's workers keep working, whatever moves inside."""

import importlib

import pytest

STABLE = [
    ("recon_dagster.worker", "run_or_resume"),
    ("recon_dagster.worker", "make_on_task_created"),
    ("recon_dagster.worker", "mark_provider_call_start"),
    ("recon_dagster.worker", "finalize_job_with_media"),
    ("recon_dagster.worker", "ProviderResult"),
    ("recon_dagster.worker", "providers_from_env"),
    ("recon_dagster.worker", "media_store_from_env"),
    ("recon_dagster.providers", "providers_from_env"),
    ("recon_dagster.reconcile.finalize", "finalize_job_with_media"),
    ("recon_dagster.definitions", "defs"),
    ("recon_dagster.cli", "main"),
]


@pytest.mark.parametrize(("module", "name"), STABLE)
def test_documented_import_path_resolves(module: str, name: str) -> None:
    assert callable(getattr(importlib.import_module(module), name)) or name == "defs"


def test_worker_surface_is_the_implementation_not_a_copy() -> None:
    from recon_dagster import worker
    from recon_dagster.reconcile import app_worker, finalize

    assert worker.run_or_resume is app_worker.run_or_resume
    assert worker.finalize_job_with_media is finalize.finalize_job_with_media
