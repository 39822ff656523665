"""Replicate's routes: predictions and trainings (create, get, cancel)."""

from __future__ import annotations

import re

from recon_dagster.core.kinds import Family
from recon_dagster.sandbox import shapes
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.refusals import REPLICATE, invalid, json_body, not_found, requested_scenario
from recon_dagster.sandbox.scenario import poll_phase
from recon_dagster.sandbox.state import Task
from recon_dagster.sandbox.wire import Request, Response, json_response

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
    body = json_body(req, REPLICATE)
    match = _RE_REP_MODEL_PRED.match(req.path)
    version = body.get("version")
    if match is None and not version:
        return invalid(REPLICATE, "version is required")
    if not isinstance(body.get("input"), dict):
        return invalid(REPLICATE, "input is required and must be an object")
    kind = "replicate-prediction"
    sc = sb.scenario_for(kind, requested_scenario(body.get("sandbox_scenario"), REPLICATE), REPLICATE)
    action, refusal = sb.create_gate(REPLICATE, kind, sc)
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
    body = json_body(req, REPLICATE)
    if not body.get("destination"):
        return invalid(REPLICATE, "destination is required")
    if not isinstance(body.get("input"), dict):
        return invalid(REPLICATE, "input is required and must be an object")
    kind = "replicate-training"
    sc = sb.scenario_for(kind, requested_scenario(body.get("sandbox_scenario"), REPLICATE), REPLICATE)
    action, refusal = sb.create_gate(REPLICATE, kind, sc)
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


def _family(coll: str) -> Family:
    return Family.REPLICATE_TRAINING if coll == "trainings" else Family.REPLICATE_PREDICTION


def get(sb: SandboxCore, req: Request) -> Response:
    match = _RE_REP_GET.match(req.path)
    assert match is not None
    ticket = sb.state.poll(match["id"], (_family(match["coll"]),))
    if ticket is None:
        return not_found(REPLICATE, "The requested resource could not be found.")
    refusal = sb.ticket_response(ticket, REPLICATE)
    if refusal is not None:
        return refusal
    return sb.answer_poll(ticket.task, ticket.answered_index, REPLICATE, req)


def cancel(sb: SandboxCore, req: Request) -> Response:
    match = _RE_REP_CANCEL.match(req.path)
    assert match is not None
    ticket = sb.state.task_request(match["id"], (_family(match["coll"]),))
    if ticket is None:
        return not_found(REPLICATE, "The requested resource could not be found.")
    refusal = sb.ticket_response(ticket, REPLICATE)
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


ROUTES = (
    Route("POST", _create_prediction_path, predict, create=True),
    Route("POST", _RE_REP_TRAIN_CREATE.match, train, create=True),
    Route("GET", _RE_REP_GET.match, get),
    Route("POST", _RE_REP_CANCEL.match, cancel),
)
