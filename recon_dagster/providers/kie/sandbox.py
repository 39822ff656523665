"""KIE's routes: market/Veo/Suno/Kontext/Runway/Luma task create and poll, and chat completions."""

from __future__ import annotations

import re
import uuid
from typing import Any

from recon_dagster.providers.kie import sandbox_shapes, sandbox_spend
from recon_dagster.providers.kie.sandbox_shapes import KieRefusals
from recon_dagster.providers.kie.spec import NAME, SPEC, KieFamily
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.plugins import PluginFamily, SandboxPlugin
from recon_dagster.sandbox.refusals import invalid, json_body, requested_scenario
from recon_dagster.sandbox.wire import BadRequest, Request, Response, bearer, json_response

# Market models route to the kind whose thresholds fit them; a body may say ``sandbox_kind``.
_MARKET_KINDS = ("kie-standard", "kie-kling3", "kie-lip-sync")


def _market_kind(model: str, override: Any) -> str:
    if override is not None:
        if override not in _MARKET_KINDS:
            raise BadRequest(invalid(NAME, f"sandbox_kind must be one of {', '.join(_MARKET_KINDS)}"))
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
    body = json_body(req, NAME)
    missing = [name for name in required if not body.get(name)]
    if missing:
        return invalid(NAME, f"{', '.join(missing)} is required")
    if family == KieFamily.MARKET:
        if not isinstance(body.get("input", {}), dict):
            return invalid(NAME, "input must be an object")
        kind = _market_kind(str(body["model"]), body.get("sandbox_kind"))
    else:
        kind = _FAMILY_KIND[family]
    sc = sb.scenario_for(kind, requested_scenario(body.get("sandbox_scenario"), NAME), NAME)
    action, refusal = sb.create_gate(NAME, kind, sc)
    if refusal is not None:
        return refusal
    params = {k: v for k, v in body.items() if k not in ("sandbox_scenario", "sandbox_kind")}
    model = params.get("model")
    task_input = params.get("input") if family == KieFamily.MARKET else params
    task = sb.state.add_task(kind, sc, via_create=True, model=model, input=task_input)
    sb.state.record_create(kind, task.task_id, req.body)
    if action == "lost":
        return Response(0, drop=True, delay_s=sb.latency(sc))
    data = sandbox_shapes.kie_envelope({"taskId": task.task_id})
    return json_response(200, data, delay_s=sb.latency(sc))


def poll(sb: SandboxCore, req: Request) -> Response:
    family = _KIE_POLL[req.path]
    task_id = req.q("taskId")
    if not task_id:
        return invalid(NAME, "taskId is required")
    ticket = sb.state.poll(task_id, (family,))
    if ticket is None:
        return json_response(200, sandbox_shapes.kie_error(422, "recordInfo is null"), delay_s=sb.latency_s)
    refusal = sb.ticket_response(ticket, NAME)
    if refusal is not None:
        return refusal
    return sb.answer_poll(ticket.task, ticket.answered_index, NAME, req)


def chat(sb: SandboxCore, req: Request) -> Response:
    match = _RE_KIE_CHAT.match(req.path)
    assert match is not None
    body = json_body(req, NAME)
    model = match.group("model") or body.get("model")
    if not model:
        return invalid(NAME, "model is required")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        return invalid(NAME, "messages must be a non-empty array")
    sc = sb.scenario_for("kie-llm", requested_scenario(body.get("sandbox_scenario"), NAME), NAME)
    refusal = sb.sync_gate(NAME, "kie-llm", sc, req)
    if refusal is not None:
        return refusal
    if sc.outcome == "fail":
        message = sc.error_message or "The model failed to produce a completion"
        return json_response(200, sandbox_shapes.kie_error(500, message), delay_s=sb.latency(sc))
    text = "Sandbox completion."
    return json_response(
        200, sandbox_shapes.chat_completion(str(model), text, len(req.body) // 4), delay_s=sb.latency(sc)
    )


# The successFlag families: where the flag lives, and their failure flags (the first is the default).
_FLAG = ("data", "successFlag")
_FLAG_FAILS = ("3", "2")

ROUTES = (
    Route("POST", _KIE_CREATE.__contains__, create, create=True),
    Route("GET", _KIE_POLL.__contains__, poll),
    Route("POST", _RE_KIE_CHAT.match, chat, create=True),
)

# Loaded by the sandbox by name (``SPEC.sandbox``): routes, auth, refusals and families.
SANDBOX = SandboxPlugin(
    provider=NAME,
    routes=(*ROUTES, *sandbox_spend.ROUTES),
    env=lambda base_url, key: {SPEC.settings.base_url_env: base_url, SPEC.settings.key_env: key},
    presented_key=lambda req: bearer(req.headers.get("Authorization")),
    refusals=KieRefusals(),
    scenario_fields={"kie_http200_errors": "http200_errors"},
    families={
        KieFamily.MARKET: PluginFamily(
            "image",
            ("fail",),
            ("waiting", "queuing", "generating"),
            ("data", "state"),
            sandbox_shapes.render_market,
        ),
        KieFamily.VEO: PluginFamily("video", _FLAG_FAILS, (0,), _FLAG, sandbox_shapes.render_veo),
        KieFamily.SUNO: PluginFamily(
            "audio",
            ("GENERATE_AUDIO_FAILED", "CREATE_TASK_FAILED", "CALLBACK_EXCEPTION", "SENSITIVE_WORD_ERROR"),
            ("PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"),
            ("data", "status"),
            sandbox_shapes.render_suno,
        ),
        KieFamily.KONTEXT: PluginFamily(
            "image", _FLAG_FAILS, (0,), _FLAG, sandbox_shapes.render_kontext, single_media=True
        ),
        KieFamily.LUMA: PluginFamily("video", _FLAG_FAILS, (0,), _FLAG, sandbox_shapes.render_luma),
        KieFamily.RUNWAY: PluginFamily(
            "video",
            ("fail",),
            ("wait", "queueing", "generating"),
            ("data", "state"),
            sandbox_shapes.render_runway,
            new_task_id=lambda: str(uuid.uuid4()),  # Runway's ids are UUIDs; the others hex
            single_media=True,
        ),
        KieFamily.LLM: PluginFamily("text"),
    },
)
