"""Replicate's answers in the sandbox: its problem+json refusals and its prediction/training body."""

from __future__ import annotations

from typing import Any

from recon_dagster.providers.replicate.spec import ReplicateFamily
from recon_dagster.sandbox import shapes
from recon_dagster.sandbox.refusals import Refusals
from recon_dagster.sandbox.scenario import Scenario
from recon_dagster.sandbox.shapes import Links, iso_time
from recon_dagster.sandbox.state import Task
from recon_dagster.sandbox.wire import Response, json_response

SANDBOX_VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
PROBLEM = "application/problem+json"


def replicate_problem(status: int, title: str, detail: str) -> dict[str, Any]:
    return {"title": title, "detail": detail, "status": status}


class ReplicateRefusals(Refusals):
    """Replicate's refusals: problem+json bodies; its server errors default to 503."""

    def unauthorized(self, missing: bool) -> Response:
        body = replicate_problem(401, "Unauthenticated", "You did not pass a valid authentication token")
        return json_response(401, body, content_type=PROBLEM)

    def echo_key(self, message: str, delay_s: float) -> Response:
        body = replicate_problem(401, "Unauthenticated", message)
        return json_response(401, body, content_type=PROBLEM, delay_s=delay_s)

    def throttled(self, sc: Scenario, delay_s: float) -> Response:
        retry = str(sc.retry_after_s)
        headers = {"Retry-After": retry, "ratelimit-remaining": "0", "ratelimit-reset": retry}
        body = {"detail": f"Request was throttled. Expected available in {retry} second.", "status": 429}
        return json_response(429, body, headers, PROBLEM, delay_s)

    def server_error(self, sc: Scenario, delay_s: float) -> Response:
        status = sc.server_error_status or 503
        body = replicate_problem(status, "Service Unavailable", "Please retry shortly")
        return json_response(status, body, content_type=PROBLEM, delay_s=delay_s)

    def invalid(self, message: str) -> Response:
        return json_response(
            422, replicate_problem(422, "Input validation failed", message), content_type=PROBLEM
        )

    def not_found(self, message: str) -> Response:
        return json_response(404, replicate_problem(404, "Not found", message), content_type=PROBLEM)

    def rejected(self, status: int, message: str, delay_s: float) -> Response:
        body = replicate_problem(status, "Request rejected", message)
        return json_response(status, body, content_type=PROBLEM, delay_s=delay_s)

    def timed_out(self) -> Response:
        return json_response(504, {"code": 504, "msg": "Request timed out", "data": None})


def render(task: Task, phase: str, i: int, links: Links) -> dict[str, Any]:
    sc = task.scenario
    training = task.family == ReplicateFamily.TRAINING
    collection = "trainings" if training else "predictions"
    get_url = f"{links.base}/replicate/v1/{collection}/{task.task_id}"
    status: str
    output: Any = None
    error: str | None = None
    if task.canceled:
        status = "canceled"
    elif phase == "running":
        status = shapes.running_value(task.family, i)
    elif phase == "succeeded":
        status = "succeeded"
        if not sc.data_removed:
            if training:
                output = {
                    "version": f"sandbox/trained:{task.task_id}",
                    "weights": links.media[0],
                }
            elif sc.output_as_string:
                output = links.media[0]
            else:
                output = list(links.media)
    else:
        status = shapes.fail_value(task.family, sc)
        if status == "failed":
            error = (
                sc.error_message
                or f"{'Training' if training else 'Prediction'} failed: sandbox model raised an error"
            )
    done = status in ("succeeded", "failed", "canceled", "aborted")
    body: dict[str, Any] = {
        "id": task.task_id,
        "model": task.model or ("sandbox/trainer" if training else "sandbox/model"),
        "version": task.meta.get("version", SANDBOX_VERSION),
        "input": task.input,
        "logs": "sandbox: done\n" if done else "sandbox: working\n",
        "output": output,
        "data_removed": bool(done and status == "succeeded" and sc.data_removed),
        "error": error,
        "status": status,
        "source": "api",
        "created_at": iso_time(task.created_at),
        "started_at": iso_time(task.started_at) if status != "starting" else None,
        "completed_at": iso_time(task.completed_at) if done else None,
        "urls": {"get": get_url, "cancel": f"{get_url}/cancel"},
        "metrics": {},
    }
    if done and status == "succeeded":
        start = task.started_at or task.created_at
        # A task seeded with its compute seconds (meta "predict_time") reports them, as billed.
        seconds = task.meta.get("predict_time", round((task.completed_at or start) - start, 3))
        body["metrics"] = {"predict_time": seconds, **({"total_time": seconds} if training else {})}
    return body
