"""Spend reconciliation test helpers: charges as the app records them, and one spend asset
materialized in-process against the sandbox with its check's evaluation."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import sqlalchemy as sa

from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.providers import ProvidersResource
from recon_dagster.providers.anthropic.spend import AnthropicUsageResource
from recon_dagster.sandbox import SandboxServer
from recon_dagster_tests.support.factories import make_job, reserve, sql

DAY_S = 86_400.0


def yesterday() -> str:
    """The latest complete day: the newest partition of the spend assets."""
    return (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d")


def back_date(db: sa.Engine, sandbox: SandboxServer, seconds: float = DAY_S) -> None:
    """Move everything seeded so far ``seconds`` into the past, at the sandbox (its tasks and
    billed calls) and in our tables (charges and the ledger), as if it had happened then."""
    state = sandbox.sandbox.state
    with state._lock:
        state.create_times[:] = [t - seconds for t in state.create_times]
        for task in state.tasks.values():
            task.created_at -= seconds
            task.started_at = None if task.started_at is None else task.started_at - seconds
            task.completed_at = None if task.completed_at is None else task.completed_at - seconds
    with db.begin() as conn:
        shift = {"s": seconds}
        conn.execute(
            sa.text("UPDATE usage_logs SET created_at = created_at - make_interval(secs => :s)"), shift
        )
        conn.execute(
            sa.text("UPDATE upstream_creates SET intent_at = intent_at - make_interval(secs => :s)"), shift
        )


def charged_job(
    db: sa.Engine,
    user: uuid.UUID,
    kind: str,
    *,
    task_id: str | None = None,
    status: str = "committed",
    cost_usd: float = 0.05,
    **metadata: Any,
) -> uuid.UUID:
    """A job of ``kind`` whose row names ``task_id``, with its usage_logs row settled to ``status``
    and ``metadata`` recorded on it (what the app's worker writes)."""
    job = make_job(db, user, status="completed" if status == "committed" else "failed", provider_kind=kind,
                   provider_task_id=task_id)  # fmt: skip
    reserve(db, job, user, 5)
    sql(
        db,
        "UPDATE usage_logs SET status = :s, settled_at = now(), provider_cost_usd = :c, "
        "metadata = metadata || CAST(:m AS jsonb) WHERE job_id = :j",
        s=status, c=cost_usd, m=json.dumps(metadata), j=str(job),
    )  # fmt: skip
    return job


def resources(
    providers: ProvidersResource, sandbox: SandboxServer, *, admin_key: bool = True
) -> dict[str, Any]:
    return {
        "providers": providers,
        "database": DatabaseResource(),
        "anthropic_usage": AnthropicUsageResource(
            base_url=sandbox.api_base_url("anthropic"), api_key=sandbox.sandbox.api_key if admin_key else ""
        ),
    }


@dataclass(frozen=True)
class Reconciled:
    metadata: dict[str, Any]
    check: dg.AssetCheckEvaluation

    def value(self, key: str) -> Any:
        return self.metadata[key].value if hasattr(self.metadata[key], "value") else self.metadata[key]

    def named(self) -> set[tuple[str, str]]:
        return {(n["what"], n["id"]) for n in self.value("named")}


def reconcile(
    asset: dg.AssetsDefinition,
    instance: dg.DagsterInstance,
    res: dict[str, Any],
    partition: str | None = None,
) -> Reconciled:
    """Materialize one spend asset for ``partition`` (yesterday) in-process; its metadata and check."""
    result = dg.materialize([asset], partition_key=partition or yesterday(), instance=instance, resources=res)
    assert result.success
    [materialization] = result.asset_materializations_for_node(asset.op.name)
    [check] = result.get_asset_check_evaluations()
    return Reconciled(dict(materialization.metadata), check)
