"""Shared pieces of the reconcile tests: Dagster definitions wired to the test database, the
sandbox and a temporary media folder, and a one-tick driver."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg
import sqlalchemy as sa

from recon_dagster.cli.run_once import OnceReport, evaluate_sensor, reconcile_once  # noqa: F401
from recon_dagster.definitions import build_defs
from recon_dagster.defs.resources import ReconcileSettingsResource
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.finalize import MediaPolicy


def make_defs(media_dir: str, **settings: Any) -> dg.Definitions:
    """The project's definitions, with test-sized settings and a temp media folder."""
    return build_defs(
        {
            "providers": providers_from_env(),
            "media_store": LocalMediaStore(base_dir=media_dir),
            "reconcile_settings": ReconcileSettingsResource(**settings),
        }
    )


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, *, sweep: bool = False) -> OnceReport:
    """One sensor evaluation, then its run requests executed in-process (and the sweep job)."""
    return reconcile_once(defs, instance=instance, sweep=sweep)


def one(engine: sa.Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(sql), {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in params.items()}
        ).scalar()


def usage_status(engine: sa.Engine, job_id: uuid.UUID) -> str | None:
    return one(engine, "SELECT status FROM usage_logs WHERE job_id = :j", j=job_id)


def count(engine: sa.Engine, table: str, job_id: uuid.UUID) -> int:
    return int(one(engine, f"SELECT count(*) FROM {table} WHERE job_id = :j", j=job_id))


def finished_training(sandbox: Any) -> tuple[str, Any, Any]:
    """A LoRA training the sandbox has finished: (task id, its ProviderResult, the media policy
    whose headers fetch its weights)."""
    from recon_dagster.reconcile.finalize import MediaPolicy, ProviderResult
    from recon_dagster.sandbox import Scenario

    providers = providers_from_env()
    task = sandbox.add_task("replicate-training", Scenario(polls_before_done=0))
    result = ProviderResult.from_status(providers.poll("replicate-training", task))
    return task, result, MediaPolicy(headers_for=providers.media_headers)


@contextmanager
def statements_like(engine: sa.Engine, fragment: str) -> Iterator[list[str]]:
    """Collects every statement ``engine`` sends that contains ``fragment``, while inside."""
    seen: list[str] = []

    def _collect(conn, cursor, statement, parameters, context, executemany):
        if fragment in statement:
            seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", _collect)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", _collect)


def stale_job_with_task(
    db,
    sandbox,
    kind,
    scenario=None,
    *,
    minutes=None,
    job_type="image",
    attempts=0,
    user=None,
    credits=(30, 20, 10),
    **kw,
):
    """An in-flight job of ``kind`` past its stale threshold (``minutes`` since its provider call
    otherwise), its sandbox task made by ``scenario`` (finished at the first poll by default).

    ``user`` defaults to a new one with 100 subscription and 50 top-up credits. ``credits`` is what
    is reserved: ``(amount, from_sub, from_topup)``, 30 = 20 + 10 by default, or a bare amount for
    the app's own split (subscription first). ``kw`` goes to ``make_job``.

    Returns ``(user, job, task)``."""
    from recon_dagster.core.kinds import KINDS
    from recon_dagster.sandbox.scenario import Scenario
    from recon_dagster_tests.support.factories import make_job, make_user, reserve

    user = user if user is not None else make_user(db, sub=100, topup=50)
    task = sandbox.add_task(kind, scenario or Scenario(polls_before_done=0))
    minutes = minutes if minutes is not None else KINDS[kind].stale_threshold.total_seconds() / 60 + 1
    job = make_job(
        db,
        user,
        job_type=job_type,
        provider_kind=kind,
        provider_task_id=task,
        started_minutes_ago=minutes,
        reconcile_attempts=attempts,
        **kw,
    )
    if isinstance(credits, tuple):
        amount, from_sub, from_topup = credits
        reserve(db, job, user, amount, from_sub=from_sub, from_topup=from_topup)
    else:
        reserve(db, job, user, credits)
    return user, job, task


def stale_job_id(db, sandbox, kind, scenario=None, **kw):
    """``stale_job_with_task``'s job id alone."""
    return stale_job_with_task(db, sandbox, kind, scenario, **kw)[1]


def media_policy() -> MediaPolicy:
    """The media policy a reconcile run uses, with the providers' media headers from the environment."""
    return MediaPolicy(headers_for=providers_from_env().media_headers)


def stored_files(media_dir: str) -> dict[str, str]:
    """Every file under ``media_dir`` (relative path) with the sha256 of its bytes."""
    import hashlib
    from pathlib import Path

    base = Path(media_dir)
    return {
        str(p.relative_to(base)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in base.rglob("*")
        if p.is_file()
    }


def finished_kie_job(db, sandbox, user, *, credits=5, **job_fields):
    """A stale ``kie-standard`` job of ``user`` whose sandbox task finishes at the first poll, with
    ``credits`` reserved; ``job_fields`` go to ``make_job`` (a workflow, a node, is_public...).

    Returns ``(job, task)``."""
    from recon_dagster.sandbox.scenario import Scenario
    from recon_dagster_tests.support.factories import make_job, reserve

    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    job = make_job(
        db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=11, **job_fields
    )
    reserve(db, job, user, credits)
    return job, task
