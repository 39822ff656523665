"""What the sandbox's list routes share: opaque cursors, time filters, and a listed task's body.

A provider package's ``sandbox_tasks`` module answers its list endpoint in the provider's own
shape with these. Listing is not a poll: it never moves a task along its scenario; a listed task
shows the phase its last poll answered.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

from recon_dagster.sandbox import shapes
from recon_dagster.sandbox.core import SandboxCore
from recon_dagster.sandbox.scenario import poll_phase
from recon_dagster.sandbox.state import Task


def parse_when(value: str | None) -> float | None:
    """A filter's ISO-8601 time as unix seconds; ValueError when it is not one."""
    if value is None:
        return None
    when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    if not raw.startswith("o:"):
        raise ValueError(cursor)
    return int(raw[2:])


def listed_phase(task: Task) -> str:
    """The phase a list shows: the last poll's answer; a task never polled is running unless
    its scenario is done at once."""
    if task.answered:
        return poll_phase(task.answered - 1, task.scenario)
    return poll_phase(0, task.scenario) if task.scenario.polls_before_done == 0 else "running"


def listed_body(sb: SandboxCore, task: Task, now: float) -> dict[str, Any]:
    phase = listed_phase(task)
    sb.state.mark_times(task, phase, now)
    return shapes.poll_body(task, phase, 0, sb.links(task))
