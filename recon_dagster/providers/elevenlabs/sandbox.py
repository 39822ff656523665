"""ElevenLabs' routes: dubbing (create, get, audio) and text-to-speech."""

from __future__ import annotations

import re
import secrets
import string

from recon_dagster.providers.elevenlabs import sandbox_shapes, sandbox_spend, sandbox_tasks
from recon_dagster.providers.elevenlabs.sandbox_shapes import ElevenLabsRefusals
from recon_dagster.providers.elevenlabs.sandbox_spend import request_id_of
from recon_dagster.providers.elevenlabs.spec import NAME, SPEC, ElevenLabsFamily
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.plugins import PluginFamily, SandboxPlugin
from recon_dagster.sandbox.refusals import form_body, invalid, json_body, requested_scenario
from recon_dagster.sandbox.scenario import poll_phase
from recon_dagster.sandbox.state import Task
from recon_dagster.sandbox.wire import Request, Response, json_response

_RE_DUB_GET = re.compile(r"^/elevenlabs/v1/dubbing/(?P<id>[^/]+)$")
_RE_DUB_AUDIO = re.compile(r"^/elevenlabs/v1/dubbing/(?P<id>[^/]+)/audio/(?P<lang>[^/]+)$")
_RE_TTS = re.compile(r"^/elevenlabs/v1/text-to-speech/(?P<voice>[^/]+)(?:/stream)?$")


def dub_create(sb: SandboxCore, req: Request) -> Response:
    form = form_body(req, NAME)
    target = form.get("target_lang")
    if not isinstance(target, str) or not target:
        return invalid(NAME, "target_lang is required")
    if not form.get("file") and not form.get("source_url"):
        return invalid(NAME, "either file or source_url is required")
    kind = "elevenlabs-async"
    sc = sb.scenario_for(kind, requested_scenario(form.get("sandbox_scenario"), NAME), NAME)
    action, refusal = sb.create_gate(NAME, kind, sc)
    if refusal is not None:
        return refusal
    meta = {k: form[k] for k in ("name", "source_lang") if isinstance(form.get(k), str)}
    task = sb.state.add_task(
        kind,
        sc,
        via_create=True,
        target_languages=(target,),
        meta=meta,
        input={k: v for k, v in form.items() if isinstance(v, str) and k != "sandbox_scenario"},
    )
    sb.state.record_create(kind, task.task_id, req.body)
    if action == "lost":
        return Response(0, drop=True, delay_s=sb.latency(sc))
    body = {"dubbing_id": task.task_id, "expected_duration_sec": 12.5}
    return json_response(200, body, delay_s=sb.latency(sc))


def dub_get(sb: SandboxCore, req: Request) -> Response:
    match = _RE_DUB_GET.match(req.path)
    assert match is not None
    ticket = sb.state.poll(match["id"], (ElevenLabsFamily.DUBBING,))
    if ticket is None:
        message = f"Dubbing {match['id']} not found"
        body = sandbox_shapes.elevenlabs_error("not_found", "dubbing_not_found", message)
        return json_response(404, body, delay_s=sb.latency_s)
    refusal = sb.ticket_response(ticket, NAME)
    if refusal is not None:
        return refusal
    return sb.answer_poll(ticket.task, ticket.answered_index, NAME, req)


def dub_audio(sb: SandboxCore, req: Request) -> Response:
    match = _RE_DUB_AUDIO.match(req.path)
    assert match is not None
    ticket = sb.state.task_request(match["id"], (ElevenLabsFamily.DUBBING,))
    if ticket is None:
        body = sandbox_shapes.elevenlabs_error(
            "not_found", "dubbing_not_found", f"Dubbing {match['id']} not found"
        )
        return json_response(404, body)
    task = ticket.task
    sb.state.count_media(task.task_id)
    refusal = sb.ticket_response(ticket, NAME)
    if refusal is not None:
        return refusal
    sc = task.scenario
    if match["lang"] not in task.target_languages:
        body = sandbox_shapes.elevenlabs_error(
            "not_found",
            "language_not_found",
            f"Language {match['lang']} is not a target language of this dubbing",
        )
        return json_response(404, body)
    # "Now" upstream: what the next poll would report.
    if poll_phase(task.answered, sc) != "succeeded":
        body = sandbox_shapes.elevenlabs_error(
            "invalid_request", "dubbing_not_ready", "Dubbing is not finished"
        )
        return json_response(425, body, delay_s=sb.latency(sc))
    if sc.media_status != 200:
        body = sandbox_shapes.elevenlabs_error(
            "not_found", "audio_not_found", "Dubbed audio is not available"
        )
        return json_response(sc.media_status, body, delay_s=sb.latency(sc))
    return sb.stream(task.task_id, 0, "audio", sc, req.method)


def tts(sb: SandboxCore, req: Request) -> Response:
    body = json_body(req, NAME)
    if not isinstance(body.get("text"), str) or not body["text"]:
        return invalid(NAME, "text is required")
    kind = "elevenlabs-sync"
    sc = sb.scenario_for(kind, requested_scenario(body.get("sandbox_scenario"), NAME), NAME)
    refusal = sb.sync_gate(NAME, kind, sc, req)
    if refusal is not None:
        return refusal
    if sc.outcome == "fail":
        message = sc.error_message or "Speech generation failed"
        err = sandbox_shapes.elevenlabs_error("invalid_request", "generation_failed", message)
        return json_response(400, err, delay_s=sb.latency(sc))
    response = sb.stream(f"tts-{sb.state.create_count(kind)}", 0, "audio", sc, req.method)
    response.headers.update(
        {
            "x-character-count": str(len(body["text"])),
            "request-id": request_id_of(sb.state.create_count(kind)),
        }
    )
    return response


_ID_ALPHABET = string.ascii_letters + string.digits


def _new_id() -> str:
    """ElevenLabs' dubbing ids: 20 letters and digits."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(20))


def _audio_urls(task: Task, base_url: str) -> list[str]:
    """A dub's media is fetched from the audio endpoint, one per target language."""
    return [f"{base_url}/elevenlabs/v1/dubbing/{task.task_id}/audio/{lang}" for lang in task.target_languages]


ROUTES = (
    Route("POST", "/elevenlabs/v1/dubbing".__eq__, dub_create, create=True),
    Route("GET", _RE_DUB_AUDIO.match, dub_audio),
    Route("GET", _RE_DUB_GET.match, dub_get),
    Route("POST", _RE_TTS.match, tts, create=True),
)

# Loaded by the sandbox by name (``SPEC.sandbox``): routes, auth, refusals and families.
SANDBOX = SandboxPlugin(
    provider=NAME,
    routes=(*ROUTES, *sandbox_tasks.ROUTES, *sandbox_spend.ROUTES),
    env=lambda base_url, key: {SPEC.settings.base_url_env: base_url, SPEC.settings.key_env: key},
    presented_key=lambda req: req.headers.get("xi-api-key"),
    refusals=ElevenLabsRefusals(),
    key_header="xi-api-key",
    families={
        ElevenLabsFamily.DUBBING: PluginFamily(
            "audio",
            ("failed",),
            ("preparing", "dubbing"),
            ("status",),
            sandbox_shapes.render_dubbing,
            new_task_id=_new_id,
            media_urls=_audio_urls,
        ),
        ElevenLabsFamily.TTS: PluginFamily("audio"),
    },
)
