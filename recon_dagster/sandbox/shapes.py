"""Poll bodies as pure functions of a task: each family's renderer (brought by its provider's plugin,
``sandbox/plugins.py``), the helpers they share, and the malformed bodies a misbehaving upstream sends."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from recon_dagster.sandbox import plugins
from recon_dagster.sandbox.scenario import Scenario, fail_states
from recon_dagster.sandbox.state import Task

# Each family's documented running values (successive running polls rotate through them), where
# its state field lives in a poll body (to build malformed bodies) and its poll body come from
# its provider's plugin (``plugins.py``).

DEFAULT_ERROR = "Generation failed, please try again later"


def running_value(family: str, index: int) -> Any:
    values = plugins.family_of(family).running_values
    return values[index % len(values)]


def fail_value(family: str, scenario: Scenario) -> Any:
    """The scenario's failure value, typed as the provider sends it (flags are integers)."""
    value = scenario.fail_state or fail_states(family)[0]
    return int(value) if value.isdigit() else value


# -- times in each provider's format ---------------------------------------------------------


def ms_time(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def iso_time(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- poll bodies -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Links:
    """Where a task's media and API objects live on this sandbox."""

    media: tuple[str, ...]
    covers: tuple[str, ...]
    base: str  # the sandbox itself (for API objects that link to themselves)


def poll_body(task: Task, phase: str, running_index: int, links: Links) -> dict[str, Any]:
    """The body a poll of ``task`` answers in ``phase`` (running/succeeded/failed)."""
    renderer = plugins.family_of(task.family).render
    if renderer is None:
        raise KeyError(f"{task.family} has no poll body")
    return renderer(task, phase, running_index, links)


def malformed_body(family: str, body: dict[str, Any], how: str) -> bytes:
    """Spoil a poll body the way a misbehaving upstream or proxy would."""
    if how == "not_json":
        return b"<html><body><h1>502 Bad Gateway</h1></body></html>"
    valid = json.dumps(body).encode()
    if how == "truncated":
        return valid[: max(1, len(valid) // 2)]
    spoiled = json.loads(valid)
    holder = spoiled
    path = plugins.family_of(family).state_path
    for key in path[:-1]:
        holder = holder[key]
    if how == "missing_state":
        holder.pop(path[-1], None)
    else:  # unknown_state
        holder[path[-1]] = 7 if isinstance(holder.get(path[-1]), int) else "MYSTERY_STATE"
    return json.dumps(spoiled).encode()
