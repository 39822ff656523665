"""The daemon benchmarks seed their backlog's upstream tasks with ids in each provider's own shape
(issue 49): a fal id carries its app, and the backlog benchmark seeded ``<prefix>-<n>`` for every
kind, so every fal job was answered not-found, held by the breaker, and the run never finished."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import ASYNC_KINDS, provider_specs
from recon_dagster.providers.resource import ProvidersResource, resource_class
from recon_dagster.providers.status import UpstreamState
from recon_dagster.sandbox import SandboxServer, Scenario

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import harness

KEY = "sandbox-key"


class _Seeder:
    """The benchmarks' sandbox process API (``add_tasks``) over an in-process sandbox."""

    def __init__(self, sb: SandboxServer) -> None:
        self.sb = sb

    def add_tasks(self, specs: list[tuple[str, dict[str, Any] | None, str | None]]) -> list[str]:
        return [self.sb.add_task(kind, Scenario.from_dict(sc), task_id) for kind, sc, task_id in specs]


@pytest.fixture(scope="module")
def server() -> Iterator[SandboxServer]:
    with SandboxServer(api_key=KEY) as sb:
        yield sb


def test_every_seeded_task_is_found_where_its_provider_looks(db: sa.Engine, server: SandboxServer) -> None:
    seeded = harness.seed(
        db, _Seeder(server), 12 * len(ASYNC_KINDS), prefix="bench", fail_share=0.0, sync_share=0.0,
        media_bytes=1024, rng=random.Random(49),
    )  # fmt: skip
    env = server.env()
    providers = ProvidersResource(
        **{
            spec.name: resource_class(spec)(
                base_url=env[spec.settings.base_url_env],
                api_key=KEY,
                create_rate_per_s=None,
                read_rate_per_s=None,
            )
            for spec in provider_specs()
        }
    )
    with db.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT provider_kind, provider_task_id FROM jobs WHERE id = ANY(CAST(:ids AS uuid[]))"),
            {"ids": seeded.job_ids},
        ).all()
    assert {kind for kind, _ in rows} == set(ASYNC_KINDS)  # every async kind, fal's included
    answers = {(kind, task_id): providers.poll(kind, task_id).state for kind, task_id in rows}
    not_succeeded = {key: state for key, state in answers.items() if state is not UpstreamState.SUCCEEDED}
    assert not not_succeeded, f"seeded tasks their provider does not find: {not_succeeded}"
