"""The provider sandbox's request answering: one routing table over the four providers' routes.

Routes live under path prefixes (``/kie``, ``/replicate/v1``, ``/elevenlabs``, ``/anthropic``),
media under ``/media`` and a key-less JSON admin API under ``/_sandbox``. Handlers decide what
to answer from ``SandboxState`` (holding its lock only for counters), then the server sleeps the
simulated latency and writes the response outside any lock, so many calls proceed concurrently.
"""

from __future__ import annotations

from recon_dagster.sandbox import admin
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.refusals import ANTHROPIC, ELEVENLABS, KIE, REPLICATE, not_found
from recon_dagster.sandbox.routes import (
    anthropic,
    anthropic_spend,
    elevenlabs,
    elevenlabs_spend,
    elevenlabs_tasks,
    kie,
    kie_spend,
    media,
    replicate,
    replicate_tasks,
)
from recon_dagster.sandbox.wire import BadRequest, Request, Response

# Each provider's endpoints, tried in order; the first whose method and path match answers.
ROUTES: dict[str, tuple[Route, ...]] = {
    KIE: kie.ROUTES + kie_spend.ROUTES,
    REPLICATE: replicate.ROUTES + replicate_tasks.ROUTES,
    ELEVENLABS: elevenlabs.ROUTES + elevenlabs_tasks.ROUTES + elevenlabs_spend.ROUTES,
    ANTHROPIC: anthropic.ROUTES + anthropic_spend.ROUTES,
}


class Sandbox(SandboxCore):
    """The request-answering logic, independent of the socket plumbing in ``SandboxServer``."""

    def handle(self, req: Request) -> Response:
        """Answer one request."""
        path = req.path
        if path.startswith("/_sandbox/"):
            try:
                return admin.answer(self, req)
            except BadRequest as exc:
                return exc.response
        self.state.count_request()
        if path.startswith("/media/"):
            return media.serve(self, req)
        provider = next((p for p in ROUTES if path.startswith(f"/{p}/")), None)
        if provider is None:
            return not_found(None, f"no sandbox endpoint {req.method} {path}")
        try:
            route = next((r for r in ROUTES[provider] if r.method == req.method and r.matches(path)), None)
            # Every request that reaches a provider counts against its account, answered or not.
            create = route is not None and route.create
            self.state.log_request(provider, "create" if create else "read")
            self.check_auth(provider, req)
            if route is None:
                return not_found(provider, f"no such endpoint: {req.method} {path}")
            return route.handler(self, req)
        except BadRequest as exc:
            return exc.response
