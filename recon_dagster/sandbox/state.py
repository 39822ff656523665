"""The sandbox's upstream state: tasks, default scenarios and counters, behind one short lock.

The lock is only held to read or bump counters; the HTTP handlers sleep (simulated latency) and
write responses outside it, so thousands of concurrent calls do not queue behind each other.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from recon_dagster.core.kinds import get_kind
from recon_dagster.sandbox import plugins
from recon_dagster.sandbox.scenario import Scenario, create_action, injected

CREATE_LOG_BYTES = 16 * 1024
REQUEST_LOG_MAX = 2_000_000


def max_in_window(times: list[float], window_s: float) -> int:
    """The most timestamps that fall in any half-open window ``[t, t + window_s)``."""
    ordered = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(ordered):
        while ordered[start] <= t - window_s:
            start += 1
        best = max(best, end - start + 1)
    return best


def new_task_id(family: str) -> str:
    """An id shaped like the provider's own (its family's ``new_task_id``; hex by default)."""
    plugin_family = plugins.family(family)
    if plugin_family is not None:
        return plugin_family.new_task_id()
    return uuid.uuid4().hex


@dataclass
class Task:
    """One upstream task as the provider remembers it."""

    task_id: str
    kind: str
    family: str
    scenario: Scenario
    created_at: float
    model: str | None = None
    input: dict[str, Any] = field(default_factory=dict)
    target_languages: tuple[str, ...] = ("es",)
    via_create: bool = False
    # Family-specific request details (Replicate version/destination, dubbing name, ...).
    meta: dict[str, Any] = field(default_factory=dict)
    # API requests that reached this task (drives rate_limit_first / server_error_first).
    requests: int = 0
    # Polls that got a state answer (drives polls_before_done).
    answered: int = 0
    started_at: float | None = None
    completed_at: float | None = None
    canceled: bool = False

    def info(self) -> dict[str, Any]:
        """JSON-ready summary for the admin API."""
        return {
            "task_id": self.task_id,
            "kind": self.kind,
            "family": str(self.family),
            "scenario": self.scenario.to_dict(),
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "via_create": self.via_create,
            "requests": self.requests,
            "answered_polls": self.answered,
            "canceled": self.canceled,
            "model": self.model,
        }


@dataclass(frozen=True)
class PollTicket:
    """What one API request to a task gets, decided under the lock."""

    task: Task
    injection: str  # rate_limited | server_error | answer
    answered_index: int  # the answered-poll index when injection == "answer", else -1


class SandboxState:
    """Tasks and counters; every method is thread-safe and holds the lock only briefly."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget every task, counter and default scenario."""
        with self._lock:
            self.tasks: dict[str, Task] = {}
            self.defaults: dict[str, Scenario] = {}
            self._attempts: Counter[tuple[str, str]] = Counter()
            self.creates: Counter[str] = Counter()
            # (kind, task id or None, raw body) of every create and sync call, for creates_for.
            self.create_log: list[tuple[str, str | None, bytes]] = []
            # When each create_log entry was made (the providers' usage and billing reports).
            self.create_times: list[float] = []
            # Knobs of the billing reports (routes/*_spend.py), e.g. a usage report's lag.
            self.spend: dict[str, float] = {}
            self.polls: Counter[str] = Counter()
            self.media: Counter[str] = Counter()
            self.requests_total = 0
            # (unix time, provider, "read" | "create") of every provider API request, in order.
            self.request_log: list[tuple[float, str, str]] = []

    # -- scenarios ----------------------------------------------------------------------------

    def set_default(self, kind: str, scenario: Scenario | None) -> None:
        """Scenario for tasks/calls of ``kind`` made through the API without their own."""
        if scenario is not None:
            scenario.check_for_kind(kind)
        with self._lock:
            if scenario is None:
                self.defaults.pop(kind, None)
            else:
                self.defaults[kind] = scenario
            # A new default starts its injected-failure series from scratch.
            for key in [k for k in self._attempts if k[0] == kind]:
                del self._attempts[key]

    def scenario_for(self, kind: str, requested: Scenario | None) -> Scenario:
        """The request's own scenario, else the kind's default, else a plain success."""
        if requested is not None:
            return requested
        with self._lock:
            return self.defaults.get(kind) or Scenario()

    def next_attempt(self, kind: str, scenario: Scenario) -> int:
        """0-based index of this create/sync call among those of ``kind`` under ``scenario``."""
        key = (kind, scenario.key())
        with self._lock:
            n = self._attempts[key]
            self._attempts[key] = n + 1
            return n

    def create_decision(self, kind: str, scenario: Scenario) -> str:
        """Count a create attempt and say what it gets (see ``create_action``)."""
        return create_action(self.next_attempt(kind, scenario), scenario)

    def sync_decision(self, kind: str, scenario: Scenario) -> str:
        """Count a sync call and say whether it is throttled, fails with 5xx, or is answered."""
        n = self.next_attempt(kind, scenario)
        return injected(n, scenario.rate_limit_first, scenario.server_error_first)

    # -- tasks --------------------------------------------------------------------------------

    def add_task(
        self,
        kind: str,
        scenario: Scenario | None = None,
        task_id: str | None = None,
        *,
        via_create: bool = False,
        model: str | None = None,
        input: dict[str, Any] | None = None,
        target_languages: tuple[str, ...] | None = None,
        created_at: float | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Task:
        """Register an upstream task; a duplicate id is an error (the provider's ids are unique)."""
        pk = get_kind(kind)
        if not pk.is_async:
            raise ValueError(f"{kind} is a synchronous kind: it has no upstream task to seed")
        scenario = scenario or Scenario()
        family = scenario.check_for_kind(kind)
        if task_id is not None and (not isinstance(task_id, str) or not task_id.strip()):
            raise ValueError(f"task_id must be a non-empty string, got {task_id!r}")
        with self._lock:
            tid = task_id or new_task_id(family)
            if tid in self.tasks:
                raise ValueError(f"task id {tid!r} already exists in the sandbox")
            task = Task(
                task_id=tid,
                kind=kind,
                family=family,
                scenario=scenario,
                created_at=created_at if created_at is not None else time.time(),
                model=model,
                input=dict(input or {}),
                target_languages=target_languages or ("es",),
                via_create=via_create,
                meta=dict(meta or {}),
            )
            self.tasks[tid] = task
            return task

    def get(self, task_id: str) -> Task | None:
        with self._lock:
            return self.tasks.get(task_id)

    def record_create(self, kind: str, task_id: str | None, raw_body: bytes) -> None:
        """Count one create request (async create or sync call) of ``kind``."""
        with self._lock:
            self.creates[kind] += 1
            # Only the head is kept: enough to find a job id, not a whole uploaded file.
            self.create_log.append((kind, task_id, raw_body[:CREATE_LOG_BYTES]))
            self.create_times.append(time.time())

    def creates_of(self, kinds: frozenset[str]) -> list[tuple[int, float, str, str | None, bytes]]:
        """(n-th of its kind from 1, time, kind, task id, body head) of every create of ``kinds``."""
        with self._lock:
            log = list(zip(self.create_times, self.create_log, strict=True))
        seen: Counter[str] = Counter()
        out = []
        for at, (kind, task_id, body) in log:
            seen[kind] += 1
            if kind in kinds:
                out.append((seen[kind], at, kind, task_id, body))
        return out

    def log_request(self, provider: str, op: str) -> None:
        """Timestamp one provider API request (the account-limit benchmark reads these)."""
        now = time.time()
        with self._lock:
            if len(self.request_log) < REQUEST_LOG_MAX:
                self.request_log.append((now, provider, op))

    def request_times(self, provider: str | None, op: str | None, since: float = 0.0) -> list[float]:
        """Times of the requests of ``provider`` (all if None) and ``op`` (both if None)."""
        with self._lock:
            log = list(self.request_log)
        return [
            t
            for t, p, o in log
            if t >= since and (provider is None or p == provider) and (op is None or o == op)
        ]

    def count_request(self) -> None:
        with self._lock:
            self.requests_total += 1

    def poll(self, task_id: str, families: tuple[str, ...]) -> PollTicket | None:
        """Count a poll of ``task_id``; None when no task of these families has that id."""
        with self._lock:
            self.polls[task_id] += 1
            task = self.tasks.get(task_id)
            if task is None or task.family not in families:
                return None
            return self._ticket(task, answer_counts=True)

    def task_request(self, task_id: str, families: tuple[str, ...]) -> PollTicket | None:
        """Count a non-poll API request on a task (ElevenLabs audio fetch, Replicate cancel)."""
        with self._lock:
            task = self.tasks.get(task_id)
            if task is None or task.family not in families:
                return None
            return self._ticket(task, answer_counts=False)

    def _ticket(self, task: Task, answer_counts: bool) -> PollTicket:
        sc = task.scenario
        kind = injected(task.requests, sc.rate_limit_first, sc.server_error_first)
        task.requests += 1
        index = -1
        if kind == "answer" and answer_counts:
            index = task.answered
            task.answered += 1
        return PollTicket(task, kind, index)

    def mark_times(self, task: Task, phase: str, now: float) -> None:
        """Remember when a task started and completed, so repeated polls report stable times."""
        with self._lock:
            if task.started_at is None and (phase != "running" or task.answered > 1):
                task.started_at = now
            if phase != "running" and task.completed_at is None:
                task.completed_at = now

    def cancel(self, task: Task) -> None:
        with self._lock:
            task.canceled = True
            if task.completed_at is None:
                task.completed_at = time.time()

    def listed(self, families: tuple[str, ...]) -> list[Task]:
        """The tasks of ``families``, newest first (ties by id), as a list endpoint pages them."""
        with self._lock:
            found = [t for t in self.tasks.values() if t.family in families and not t.meta.get("deleted")]
        return sorted(found, key=lambda t: (t.created_at, t.task_id), reverse=True)

    def count_media(self, task_id: str) -> None:
        with self._lock:
            self.media[task_id] += 1

    # -- counters -----------------------------------------------------------------------------

    def create_count(self, kind: str | None = None) -> int:
        with self._lock:
            return self.creates[kind] if kind is not None else sum(self.creates.values())

    def creates_for(self, key: str) -> int:
        """Creates that produced task ``key``, or whose request body contains ``key``."""
        needle = key.encode()
        with self._lock:
            log = list(self.create_log)
        return sum(1 for _, tid, body in log if tid == key or needle in body)

    def create_task_ids(self, contains: str) -> list[str]:
        needle = contains.encode()
        with self._lock:
            return [tid for _, tid, body in self.create_log if tid and (tid == contains or needle in body)]

    def stats(self, task_id: str | None = None) -> dict[str, Any]:
        """All counters as JSON-ready data (optionally one task's numbers and info)."""
        with self._lock:
            out: dict[str, Any] = {
                "requests_total": self.requests_total,
                "creates_total": sum(self.creates.values()),
                "creates": dict(self.creates),
                "tasks": len(self.tasks),
                "polls": dict(self.polls),
                "media_downloads": dict(self.media),
            }
            if task_id is not None:
                task = self.tasks.get(task_id)
                out["task"] = task.info() if task else None
                out["poll_count"] = self.polls.get(task_id, 0)
                out["media_download_count"] = self.media.get(task_id, 0)
                out["creates_for"] = sum(
                    1 for _, tid, body in self.create_log if tid == task_id or task_id.encode() in body
                )
            return out
