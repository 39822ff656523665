"""What the app's own workers import: the one documented, stable surface of this package.

A worker that calls a provider uses these around the call (spec phases 1 and 4): persist the task
id the moment it exists, mark a sync call's start, resume a persisted task instead of creating a
second one, create nothing while an earlier create may have made a task the row does not name
(``CreateMayExist``: a retry after a crash between the send and the answer looks first), and settle a success through the same finalize the reconciler uses. Where each lives
inside the package may change; these names, imported from here, do not. Each step is a call of the
contract's function in the app's database (``docs/app-contract.md``), which a worker in any other
language calls the same way.

    from recon_dagster.worker import finalize_job_with_media, providers_from_env, run_or_resume
"""

import sqlalchemy as sa

from recon_dagster.db.contract import CONTRACT_VERSION, ContractUnavailable
from recon_dagster.db.contract import require as _require
from recon_dagster.db.engine import get_engine
from recon_dagster.media.store import media_store_from_env
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.app_worker import (
    CreateMayExist,
    JobNoLongerInFlight,
    JobNotFound,
    Resumer,
    TaskAlreadyPersisted,
    make_on_task_created,
    mark_provider_call_start,
    open_create,
    run_or_resume,
)
from recon_dagster.reconcile.finalize import ProviderResult, finalize_job_with_media


def check_contract(engine: sa.Engine | None = None) -> None:
    """A worker's first call: the app's database has the contract functions this library calls
    (migration 160, ``docs/app-contract.md``) at its version or newer, else ``ContractUnavailable``
    with one line (run ``recon-dagster migrate``). The library's own calls check it too, once."""
    _require(engine or get_engine())


__all__ = [
    "CONTRACT_VERSION",
    "ContractUnavailable",
    "CreateMayExist",
    "JobNoLongerInFlight",
    "JobNotFound",
    "ProviderResult",
    "Resumer",
    "TaskAlreadyPersisted",
    "check_contract",
    "finalize_job_with_media",
    "make_on_task_created",
    "mark_provider_call_start",
    "media_store_from_env",
    "open_create",
    "providers_from_env",
    "run_or_resume",
]
