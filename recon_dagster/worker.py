"""What the app's own workers import: the one documented, stable surface of this package.

A worker that calls a provider uses these around the call (spec phases 1 and 4): persist the task
id the moment it exists, mark a sync call's start, resume a persisted task instead of creating a
second one, and settle a success through the same finalize the reconciler uses. Where each lives
inside the package may change; these names, imported from here, do not.

    from recon_dagster.worker import finalize_job_with_media, providers_from_env, run_or_resume
"""

from recon_dagster.media.store import media_store_from_env
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.app_worker import (
    JobNoLongerInFlight,
    JobNotFound,
    Resumer,
    TaskAlreadyPersisted,
    make_on_task_created,
    mark_provider_call_start,
    run_or_resume,
)
from recon_dagster.reconcile.finalize import ProviderResult, finalize_job_with_media

__all__ = [
    "JobNoLongerInFlight",
    "JobNotFound",
    "ProviderResult",
    "Resumer",
    "TaskAlreadyPersisted",
    "finalize_job_with_media",
    "make_on_task_created",
    "mark_provider_call_start",
    "media_store_from_env",
    "providers_from_env",
    "run_or_resume",
]
