"""Anthropic's route: the Messages API (a sync call, billed when it is made)."""

from __future__ import annotations

import secrets

from recon_dagster.providers.anthropic import sandbox_spend
from recon_dagster.providers.anthropic.sandbox_spend import REPLY_TEXT
from recon_dagster.providers.anthropic.spec import NAME, SPEC
from recon_dagster.sandbox import shapes
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.plugins import SandboxPlugin
from recon_dagster.sandbox.refusals import ANTHROPIC, invalid, json_body, requested_scenario
from recon_dagster.sandbox.wire import Request, Response, json_response

# Every answer's text (its output tokens: one per word, as its usage says).


def messages(sb: SandboxCore, req: Request) -> Response:
    body = json_body(req, ANTHROPIC)
    if not isinstance(body.get("model"), str) or not body["model"]:
        return invalid(ANTHROPIC, "model: Field required")
    if not isinstance(body.get("max_tokens"), int) or isinstance(body["max_tokens"], bool):
        return invalid(ANTHROPIC, "max_tokens: Field required")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        return invalid(ANTHROPIC, "messages: at least one message is required")
    kind = "anthropic-sync"
    sc = sb.scenario_for(kind, requested_scenario(body.get("sandbox_scenario"), ANTHROPIC), ANTHROPIC)
    refusal = sb.sync_gate(ANTHROPIC, kind, sc, req)
    if refusal is not None:
        return refusal
    if sc.outcome == "fail":
        message = sc.error_message or "The request could not be completed"
        return json_response(
            400, shapes.anthropic_error("invalid_request_error", message), delay_s=sb.latency(sc)
        )
    reply = shapes.anthropic_message(body["model"], REPLY_TEXT, len(req.body) // 4)
    return json_response(200, reply, {"request-id": "req_" + secrets.token_hex(12)}, delay_s=sb.latency(sc))


ROUTES = (Route("POST", "/anthropic/v1/messages".__eq__, messages, create=True),)

# Loaded by the sandbox by name (``SPEC.sandbox``). Auth, refusals, poll bodies and scenarios of this
# provider are still the sandbox's built-in ones (recon_dagster/sandbox/: core, refusals, shapes).
SANDBOX = SandboxPlugin(
    provider=NAME,
    routes=(*ROUTES, *sandbox_spend.ROUTES),
    env=lambda base_url, key: {SPEC.settings.base_url_env: base_url, SPEC.settings.key_env: key},
)
