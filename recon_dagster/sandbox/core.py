"""What every provider route shares: the sandbox's state, auth, latency, poll answers and streams.

``SandboxCore`` holds no routes; the providers' plugins (``providers/<name>/sandbox.py``) take it
as their routes' first argument, and ``app.Sandbox`` adds the routing table on top. What differs by
provider (its key, refusals, families) is asked of its plugin (``plugins.py``).
"""

from __future__ import annotations

import hmac
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from recon_dagster.sandbox import plugins, shapes
from recon_dagster.sandbox.media import MEDIA_TYPES, iter_media, media_length
from recon_dagster.sandbox.refusals import (
    echo_key,
    gzip_bomb,
    invalid,
    refusals_of,
    server_error,
    throttled,
    unauthorized,
)
from recon_dagster.sandbox.scenario import Scenario, ScenarioError, media_kind_for, poll_phase
from recon_dagster.sandbox.state import SandboxState, Task
from recon_dagster.sandbox.wire import BadRequest, Request, Response, bearer, json_response

# How long a sync call of a run_forever scenario is held open before a gateway timeout.
SYNC_HANG_S = 3600.0


class SandboxCore:
    """The request-answering state and helpers, independent of routes and socket plumbing."""

    def __init__(self, api_key: str, latency_s: float) -> None:
        self.api_key = api_key
        self.latency_s = latency_s
        self.state = SandboxState()
        self.base_url = ""
        # Set on stop and on reset, so calls held open by run_forever scenarios end promptly.
        self.release = threading.Event()
        plugins.plugins()

    def latency(self, sc: Scenario | None) -> float:
        if sc is not None and sc.latency_s is not None:
            return sc.latency_s
        return self.latency_s

    def check_auth(self, provider: str, req: Request) -> None:
        read_key = plugins.plugins()[provider].presented_key
        presented = read_key(req) if read_key is not None else bearer(req.headers.get("Authorization"))
        if not presented or not hmac.compare_digest(presented.encode(), self.api_key.encode()):
            raise BadRequest(unauthorized(provider, missing=not presented))

    def links(self, task: Task) -> shapes.Links:
        kind = media_kind_for(task.family, task.scenario)
        ext = MEDIA_TYPES[kind][0]
        family = plugins.family(task.family)
        count = 1 if family is not None and family.single_media else task.scenario.media_count
        return shapes.Links(
            media=tuple(f"{self.base_url}/media/{task.task_id}/{i}.{ext}" for i in range(count)),
            covers=tuple(f"{self.base_url}/media/{task.task_id}/cover-{i}.png" for i in range(count)),
            base=self.base_url,
        )

    def media_urls(self, task: Task) -> list[str]:
        """Where a client fetches this task's media (the media host, unless its family says)."""
        family = plugins.family(task.family)
        if family is not None and family.media_urls is not None:
            return family.media_urls(task, self.base_url)
        return list(self.links(task).media)

    def answer_poll(
        self, task: Task, answered_index: int, provider: str, req: Request | None = None
    ) -> Response:
        sc = task.scenario
        if sc.echo_key and req is not None:
            return echo_key(provider, req, self.latency(sc), sc.echo_key_escaped)
        if sc.poll_gzip_bytes:
            return Response(
                200,
                gzip_bomb(sc.poll_gzip_bytes),
                headers={"Content-Encoding": "gzip"},
                delay_s=self.latency(sc),
            )
        phase = poll_phase(answered_index, sc)
        running_index = answered_index if phase == "running" else 0
        self.state.mark_times(task, phase, time.time())
        body = shapes.poll_body(task, phase, running_index, self.links(task))
        delay = self.latency(sc)
        if sc.malformed:
            raw = shapes.malformed_body(task.family, body, sc.malformed_kind)
            ctype = "text/html" if sc.malformed_kind == "not_json" else "application/json"
            return Response(200, raw, ctype, delay_s=delay)
        if sc.gzip_polls:
            packed = zlib.compress(json.dumps(body).encode(), 6, 31)
            return Response(200, packed, headers={"Content-Encoding": "gzip"}, delay_s=delay)
        if sc.poll_drip_s:
            data = json.dumps(body).encode()
            return Response(200, self.drip([data], sc.poll_drip_s), length=len(data), delay_s=delay)
        return json_response(200, body, delay_s=delay)

    def drip(self, chunks: Iterable[bytes], every_s: float) -> Iterator[bytes]:
        """One byte every ``every_s``; the rest at once when the sandbox is reset or stopped."""
        release = self.release
        for chunk in chunks:
            for i in range(len(chunk)):
                if release.is_set():
                    yield chunk[i:]
                    break
                yield chunk[i : i + 1]
                release.wait(every_s)

    def ticket_response(self, ticket: Any, provider: str) -> Response | None:
        """A 429/5xx when the scenario injects one for this request, else None."""
        sc = ticket.task.scenario
        if ticket.injection == "rate_limited":
            return throttled(provider, sc, self.latency(sc))
        if ticket.injection == "server_error":
            return server_error(provider, sc, self.latency(sc))
        return None

    def create_gate(self, provider: str, kind: str, sc: Scenario) -> tuple[str, Response | None]:
        action = self.state.create_decision(kind, sc)
        delay = self.latency(sc)
        if action == "rate_limited":
            return action, throttled(provider, sc, delay)
        if action == "server_error":
            return action, server_error(provider, sc, delay)
        if action == "rejected":
            status = sc.create_reject_status or 400
            message = sc.error_message or "Request rejected by the provider"
            return action, refusals_of(provider).rejected(status, message, delay)
        return action, None

    def scenario_for(self, kind: str, requested: Scenario | None, provider: str) -> Scenario:
        sc = self.state.scenario_for(kind, requested)
        try:
            sc.check_for_kind(kind)
        except ScenarioError as exc:
            raise BadRequest(invalid(provider, f"sandbox_scenario: {exc}")) from None
        return sc

    def sync_gate(self, provider: str, kind: str, sc: Scenario, req: Request) -> Response | None:
        """Injected 429/5xx for a sync call, or a call held open (run_forever); counts the call."""
        decision = self.state.sync_decision(kind, sc)
        delay = self.latency(sc)
        if decision == "rate_limited":
            return throttled(provider, sc, delay)
        if decision == "server_error":
            return server_error(provider, sc, delay)
        self.state.record_create(kind, None, req.body)
        if sc.outcome == "run_forever":
            self.release.wait(SYNC_HANG_S)
            return refusals_of(provider).timed_out()
        return None

    def stream(self, key: str, n: int, kind: str, sc: Scenario, method: str) -> Response:
        length = media_length(kind, sc.media_size)
        body: Iterable[bytes] = () if method == "HEAD" else iter_media(key, n, kind, sc.media_size)
        if sc.media_drip_s and method != "HEAD":
            body = self.drip(body, sc.media_drip_s)
        return Response(
            200,
            body,
            MEDIA_TYPES[kind][1],
            length=None if sc.media_no_length else length,
            delay_s=self.latency(sc),
        )

    def reset(self) -> None:
        """Forget all tasks and counters; calls held open by run_forever end now."""
        self.release.set()
        self.release = threading.Event()
        self.state.reset()


Handler = Callable[[SandboxCore, Request], Response]


@dataclass(frozen=True)
class Route:
    """One endpoint of a provider: method, path test, handler; ``create`` when it starts billed work
    (a task, a sync call), so the request counts as a create against the provider's account."""

    method: str
    matches: Callable[[str], object]
    handler: Handler
    create: bool = False
