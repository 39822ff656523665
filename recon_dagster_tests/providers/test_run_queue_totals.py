"""The run queue's total against the providers' own limits (issue 49): the per-provider run
limits add up to more than the queue holds, and the queue wins. The queue's total is what the
default connection budget has room for; the docs, the deployment files and this check say the
same numbers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from recon_dagster.config import Settings
from recon_dagster.core.kinds import provider_specs
from recon_dagster.db.budget import most_runs_at_once

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT = ("dagster.yaml", "deploy/dagster-k8s.yaml", "deploy/helm/values.yaml")


def _queue_total(doc: Any) -> int | None:
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in ("max_concurrent_runs", "maxConcurrentRuns") and isinstance(value, int):
                return value
            found = _queue_total(value)
            if found is not None:
                return found
    return None


def _providers_total() -> int:
    return sum(spec.run_queue.provider_runs for spec in provider_specs())


@pytest.mark.parametrize("path", DEPLOYMENT)
def test_the_queue_holds_what_the_default_connection_budget_has_room_for(path: str) -> None:
    total = _queue_total(yaml.safe_load((ROOT / path).read_text()))
    assert total == most_runs_at_once(Settings.db_max_connections.default)
    # No provider's own limit is past the queue: each can use its limit when it is alone.
    assert all(spec.run_queue.provider_runs <= total for spec in provider_specs())


def test_the_docs_say_which_wins_with_the_registrys_numbers() -> None:
    text = " ".join((ROOT / "docs/deploying.md").read_text().split())
    queue = most_runs_at_once(Settings.db_max_connections.default)
    said = re.search(r"The (\d+) runs at once are also what the default connection budget \((\d+)\)", text)
    assert said is not None and (int(said[1]), int(said[2])) == (queue, Settings.db_max_connections.default)
    summed = re.search(r"the providers' own limits add up to (\d+)", text)
    assert summed is not None and int(summed[1]) == _providers_total()
    assert (
        f"the queue wins: under a backlog at every provider at once it serves them in turn within the {queue}"
        in text
    )
