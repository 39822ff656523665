"""Anthropic's route: the Messages API (a sync call, billed when it is made)."""

from __future__ import annotations

import secrets

from recon_dagster.providers.anthropic import sandbox_shapes, sandbox_spend
from recon_dagster.providers.anthropic.sandbox_shapes import AnthropicRefusals
from recon_dagster.providers.anthropic.sandbox_spend import REPLY_TEXT
from recon_dagster.providers.anthropic.spec import MESSAGES, NAME, SPEC
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.plugins import PluginFamily, SandboxPlugin
from recon_dagster.sandbox.refusals import invalid, json_body, requested_scenario
from recon_dagster.sandbox.wire import Request, Response, bearer, json_response

# Every answer's text (its output tokens: one per word, as its usage says).


def messages(sb: SandboxCore, req: Request) -> Response:
    body = json_body(req, NAME)
    if not isinstance(body.get("model"), str) or not body["model"]:
        return invalid(NAME, "model: Field required")
    if not isinstance(body.get("max_tokens"), int) or isinstance(body["max_tokens"], bool):
        return invalid(NAME, "max_tokens: Field required")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        return invalid(NAME, "messages: at least one message is required")
    kind = "anthropic-sync"
    sc = sb.scenario_for(kind, requested_scenario(body.get("sandbox_scenario"), NAME), NAME)
    refusal = sb.sync_gate(NAME, kind, sc, req)
    if refusal is not None:
        return refusal
    if sc.outcome == "fail":
        message = sc.error_message or "The request could not be completed"
        return json_response(
            400, sandbox_shapes.anthropic_error("invalid_request_error", message), delay_s=sb.latency(sc)
        )
    reply = sandbox_shapes.anthropic_message(body["model"], REPLY_TEXT, len(req.body) // 4)
    return json_response(200, reply, {"request-id": "req_" + secrets.token_hex(12)}, delay_s=sb.latency(sc))


def _presented_key(req: Request) -> str | None:
    # x-api-key (our client, older SDKs) or a Bearer token (its SDK since the 2026-10-21 API
    # version); x-api-key wins when both are sent.
    return req.headers.get("x-api-key") or bearer(req.headers.get("Authorization"))


ROUTES = (Route("POST", "/anthropic/v1/messages".__eq__, messages, create=True),)

# Loaded by the sandbox by name (``SPEC.sandbox``): routes, auth, refusals and families.
SANDBOX = SandboxPlugin(
    provider=NAME,
    routes=(*ROUTES, *sandbox_spend.ROUTES),
    env=lambda base_url, key: {SPEC.settings.base_url_env: base_url, SPEC.settings.key_env: key},
    presented_key=_presented_key,
    refusals=AnthropicRefusals(),
    key_header="x-api-key",
    families={MESSAGES: PluginFamily("text")},
)
