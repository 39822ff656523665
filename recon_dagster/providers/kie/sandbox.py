"""KIE's routes: market/Veo/Suno/Kontext/Runway/Luma task create and poll, and chat completions."""

from __future__ import annotations

import re
from typing import Any

from recon_dagster.providers.kie import sandbox_spend
from recon_dagster.providers.kie.spec import NAME, SPEC, KieFamily
from recon_dagster.sandbox import shapes
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.plugins import SandboxPlugin
from recon_dagster.sandbox.refusals import KIE, invalid, json_body, requested_scenario
from recon_dagster.sandbox.wire import BadRequest, Request, Response, json_response

# Market models route to the kind whose thresholds fit them; a body may say ``sandbox_kind``.
_MARKET_KINDS = ("kie-standard", "kie-kling3", "kie-lip-sync")


def _market_kind(model: str, override: Any) -> str:
    if override is not None:
        if override not in _MARKET_KINDS:
            raise BadRequest(invalid(KIE, f"sandbox_kind must be one of {', '.join(_MARKET_KINDS)}"))
        return str(override)
    lowered = model.lower()
    if "kling" in lowered:
        return "kie-kling3"
    if any(word in lowered for word in ("lip", "infinitalk", "avatar", "talking")):
        return "kie-lip-sync"
    return "kie-standard"


# KIE create path -> (family, required fields)
_KIE_CREATE: dict[str, tuple[str, tuple[str, ...]]] = {
    "/kie/api/v1/jobs/createTask": (KieFamily.MARKET, ("model",)),
    "/kie/api/v1/veo/generate": (KieFamily.VEO, ("prompt",)),
    "/kie/api/v1/generate": (KieFamily.SUNO, ()),
    "/kie/api/v1/flux/kontext/generate": (KieFamily.KONTEXT, ("prompt",)),
    "/kie/api/v1/runway/generate": (KieFamily.RUNWAY, ("prompt",)),
    "/kie/api/v1/modify/generate": (KieFamily.LUMA, ("prompt", "videoUrl")),
}
_KIE_POLL: dict[str, str] = {
    "/kie/api/v1/jobs/recordInfo": KieFamily.MARKET,
    "/kie/api/v1/veo/record-info": KieFamily.VEO,
    "/kie/api/v1/generate/record-info": KieFamily.SUNO,
    "/kie/api/v1/flux/kontext/record-info": KieFamily.KONTEXT,
    "/kie/api/v1/runway/record-detail": KieFamily.RUNWAY,
    "/kie/api/v1/modify/record-info": KieFamily.LUMA,
}
# The kind of a non-market create (a market model's kind depends on the model).
_FAMILY_KIND: dict[str, str] = {
    KieFamily.VEO: "kie-veo",
    KieFamily.SUNO: "kie-suno",
    KieFamily.KONTEXT: "kie-kontext",
    KieFamily.RUNWAY: "kie-runway",
    KieFamily.LUMA: "kie-luma",
}

# Model names may hold a slash ("anthropic/claude-sonnet-4"); KIE puts the model in the path.
_RE_KIE_CHAT = re.compile(r"^/kie/(?:(?P<model>.+?)/)?v1/chat/completions$")


def create(sb: SandboxCore, req: Request) -> Response:
    family, required = _KIE_CREATE[req.path]
    body = json_body(req, KIE)
    missing = [name for name in required if not body.get(name)]
    if missing:
        return invalid(KIE, f"{', '.join(missing)} is required")
    if family == KieFamily.MARKET:
        if not isinstance(body.get("input", {}), dict):
            return invalid(KIE, "input must be an object")
        kind = _market_kind(str(body["model"]), body.get("sandbox_kind"))
    else:
        kind = _FAMILY_KIND[family]
    sc = sb.scenario_for(kind, requested_scenario(body.get("sandbox_scenario"), KIE), KIE)
    action, refusal = sb.create_gate(KIE, kind, sc)
    if refusal is not None:
        return refusal
    params = {k: v for k, v in body.items() if k not in ("sandbox_scenario", "sandbox_kind")}
    model = params.get("model")
    task_input = params.get("input") if family == KieFamily.MARKET else params
    task = sb.state.add_task(kind, sc, via_create=True, model=model, input=task_input)
    sb.state.record_create(kind, task.task_id, req.body)
    if action == "lost":
        return Response(0, drop=True, delay_s=sb.latency(sc))
    data = shapes.kie_envelope({"taskId": task.task_id})
    return json_response(200, data, delay_s=sb.latency(sc))


def poll(sb: SandboxCore, req: Request) -> Response:
    family = _KIE_POLL[req.path]
    task_id = req.q("taskId")
    if not task_id:
        return invalid(KIE, "taskId is required")
    ticket = sb.state.poll(task_id, (family,))
    if ticket is None:
        return json_response(200, shapes.kie_error(422, "recordInfo is null"), delay_s=sb.latency_s)
    refusal = sb.ticket_response(ticket, KIE)
    if refusal is not None:
        return refusal
    return sb.answer_poll(ticket.task, ticket.answered_index, KIE, req)


def chat(sb: SandboxCore, req: Request) -> Response:
    match = _RE_KIE_CHAT.match(req.path)
    assert match is not None
    body = json_body(req, KIE)
    model = match.group("model") or body.get("model")
    if not model:
        return invalid(KIE, "model is required")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        return invalid(KIE, "messages must be a non-empty array")
    sc = sb.scenario_for("kie-llm", requested_scenario(body.get("sandbox_scenario"), KIE), KIE)
    refusal = sb.sync_gate(KIE, "kie-llm", sc, req)
    if refusal is not None:
        return refusal
    if sc.outcome == "fail":
        message = sc.error_message or "The model failed to produce a completion"
        return json_response(200, shapes.kie_error(500, message), delay_s=sb.latency(sc))
    text = "Sandbox completion."
    return json_response(
        200, shapes.chat_completion(str(model), text, len(req.body) // 4), delay_s=sb.latency(sc)
    )


ROUTES = (
    Route("POST", _KIE_CREATE.__contains__, create, create=True),
    Route("GET", _KIE_POLL.__contains__, poll),
    Route("POST", _RE_KIE_CHAT.match, chat, create=True),
)

# Loaded by the sandbox by name (``SPEC.sandbox``). Auth, refusals, poll bodies and scenarios of this
# provider are still the sandbox's built-in ones (recon_dagster/sandbox/: core, refusals, shapes).
SANDBOX = SandboxPlugin(
    provider=NAME,
    routes=(*ROUTES, *sandbox_spend.ROUTES),
    env=lambda base_url, key: {SPEC.settings.base_url_env: base_url, SPEC.settings.key_env: key},
)
