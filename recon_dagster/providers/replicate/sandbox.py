"""Replicate's routes: predictions and trainings (create, get, cancel)."""

from __future__ import annotations

import re
import secrets
import string

from recon_dagster.providers.replicate import sandbox_shapes, sandbox_tasks
from recon_dagster.providers.replicate.sandbox_shapes import ReplicateRefusals
from recon_dagster.providers.replicate.spec import NAME, SPEC, ReplicateFamily
from recon_dagster.sandbox import shapes
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.plugins import PluginFamily, SandboxPlugin
from recon_dagster.sandbox.refusals import invalid, json_body, not_found, requested_scenario
from recon_dagster.sandbox.scenario import poll_phase
from recon_dagster.sandbox.state import Task
from recon_dagster.sandbox.wire import Request, Response, bearer, json_response

_RE_REP_MODEL_PRED = re.compile(r"^/replicate/v1/models/(?P<owner>[^/]+)/(?P<name>[^/]+)/predictions$")
_RE_REP_TRAIN_CREATE = re.compile(
    r"^/replicate/v1/models/(?P<owner>[^/]+)/(?P<name>[^/]+)/versions/(?P<version>[^/]+)/trainings$"
)
_RE_REP_GET = re.compile(r"^/replicate/v1/(?P<coll>predictions|trainings)/(?P<id>[^/]+)$")
_RE_REP_CANCEL = re.compile(r"^/replicate/v1/(?P<coll>predictions|trainings)/(?P<id>[^/]+)/cancel$")


def _created(sb: SandboxCore, task: Task, action: str) -> Response:
    delay = sb.latency(task.scenario)
    if action == "lost":
        return Response(0, drop=True, delay_s=delay)
    body = shapes.poll_body(task, "running", 0, sb.links(task))
    return json_response(201, body, delay_s=delay)


def predict(sb: SandboxCore, req: Request) -> Response:
    body = json_body(req, NAME)
    match = _RE_REP_MODEL_PRED.match(req.path)
    version = body.get("version")
    if match is None and not version:
        return invalid(NAME, "version is required")
    if not isinstance(body.get("input"), dict):
        return invalid(NAME, "input is required and must be an object")
    kind = "replicate-prediction"
    sc = sb.scenario_for(kind, requested_scenario(body.get("sandbox_scenario"), NAME), NAME)
    action, refusal = sb.create_gate(NAME, kind, sc)
    if refusal is not None:
        return refusal
    model = f"{match['owner']}/{match['name']}" if match else None
    meta = {"version": str(version)} if version else {}
    meta.update(
        {
            k: str(v)
            for k, v in (("webhook", body.get("webhook")), ("cancel_after", req.headers.get("Cancel-After")))
            if v
        }
    )
    task = sb.state.add_task(kind, sc, via_create=True, model=model, input=body["input"], meta=meta)
    sb.state.record_create(kind, task.task_id, req.body)
    return _created(sb, task, action)


def train(sb: SandboxCore, req: Request) -> Response:
    match = _RE_REP_TRAIN_CREATE.match(req.path)
    assert match is not None
    body = json_body(req, NAME)
    if not body.get("destination"):
        return invalid(NAME, "destination is required")
    if not isinstance(body.get("input"), dict):
        return invalid(NAME, "input is required and must be an object")
    kind = "replicate-training"
    sc = sb.scenario_for(kind, requested_scenario(body.get("sandbox_scenario"), NAME), NAME)
    action, refusal = sb.create_gate(NAME, kind, sc)
    if refusal is not None:
        return refusal
    task = sb.state.add_task(
        kind,
        sc,
        via_create=True,
        model=f"{match['owner']}/{match['name']}",
        input=body["input"],
        meta={"version": match["version"], "destination": body["destination"]},
    )
    sb.state.record_create(kind, task.task_id, req.body)
    return _created(sb, task, action)


def _family(coll: str) -> str:
    return ReplicateFamily.TRAINING if coll == "trainings" else ReplicateFamily.PREDICTION


def get(sb: SandboxCore, req: Request) -> Response:
    match = _RE_REP_GET.match(req.path)
    assert match is not None
    ticket = sb.state.poll(match["id"], (_family(match["coll"]),))
    if ticket is None:
        return not_found(NAME, "The requested resource could not be found.")
    refusal = sb.ticket_response(ticket, NAME)
    if refusal is not None:
        return refusal
    return sb.answer_poll(ticket.task, ticket.answered_index, NAME, req)


def cancel(sb: SandboxCore, req: Request) -> Response:
    match = _RE_REP_CANCEL.match(req.path)
    assert match is not None
    ticket = sb.state.task_request(match["id"], (_family(match["coll"]),))
    if ticket is None:
        return not_found(NAME, "The requested resource could not be found.")
    refusal = sb.ticket_response(ticket, NAME)
    if refusal is not None:
        return refusal
    task = ticket.task
    # Only a task that is still running upstream can be canceled.
    if poll_phase(task.answered, task.scenario) == "running":
        sb.state.cancel(task)
    phase = poll_phase(task.answered, task.scenario)
    body = shapes.poll_body(task, phase, task.answered, sb.links(task))
    return json_response(200, body, delay_s=sb.latency(task.scenario))


def _create_prediction_path(path: str) -> bool:
    return path == "/replicate/v1/predictions" or _RE_REP_MODEL_PRED.match(path) is not None


_FAILS = ("failed", "canceled", "aborted")
_RUNNING = ("starting", "processing")
_ID_ALPHABET = string.ascii_lowercase + string.digits


def _new_id() -> str:
    """Replicate's ids: 26 lower-case letters and digits."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(26))


ROUTES = (
    Route("POST", _create_prediction_path, predict, create=True),
    Route("POST", _RE_REP_TRAIN_CREATE.match, train, create=True),
    Route("GET", _RE_REP_GET.match, get),
    Route("POST", _RE_REP_CANCEL.match, cancel),
)

# Loaded by the sandbox by name (``SPEC.sandbox``): routes, auth, refusals and families.
SANDBOX = SandboxPlugin(
    provider=NAME,
    routes=(*ROUTES, *sandbox_tasks.ROUTES),
    env=lambda base_url, key: {SPEC.settings.base_url_env: f"{base_url}/v1", SPEC.settings.key_env: key},
    # Replicate still accepts its older "Token" scheme.
    presented_key=lambda req: bearer(req.headers.get("Authorization"), also=("Token",)),
    refusals=ReplicateRefusals(),
    base_path="/v1",
    families={
        ReplicateFamily.PREDICTION: PluginFamily(
            "image", _FAILS, _RUNNING, ("status",), sandbox_shapes.render, new_task_id=_new_id
        ),
        ReplicateFamily.TRAINING: PluginFamily(
            "weights",
            _FAILS,
            _RUNNING,
            ("status",),
            sandbox_shapes.render,
            new_task_id=_new_id,
            single_media=True,
        ),
    },
)
