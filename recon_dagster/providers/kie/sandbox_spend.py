"""KIE's billing record in the sandbox: the account's credit balance, which moves with its
creates. Every task created costs its kind's credits at once (as KIE takes them), except one its
scenario fails (KIE does not bill a failed generation); the balance starts at
``state.spend["kie_start_credits"]`` (default 10,000)."""

from __future__ import annotations

from recon_dagster.core.kinds import KINDS
from recon_dagster.providers.kie import sandbox_shapes
from recon_dagster.providers.kie.spec import NAME
from recon_dagster.sandbox.core import Route, SandboxCore
from recon_dagster.sandbox.wire import Request, Response, json_response

START_CREDITS = 10_000.0
DEFAULT_TASK_CREDITS = 10.0
# What a task of each kind costs in the sandbox (a stand-in for KIE's price list).
TASK_CREDITS: dict[str, float] = {"kie-veo": 60.0, "kie-kling3": 40.0, "kie-suno": 12.0, "kie-runway": 30.0}
KIE_TASK_KINDS = frozenset(k for k, spec in KINDS.items() if spec.provider == NAME and spec.is_async)


def task_credits(kind: str) -> float:
    return TASK_CREDITS.get(kind, DEFAULT_TASK_CREDITS)


def balance(sb: SandboxCore) -> float:
    spent = 0.0
    for _, _, kind, task_id, _ in sb.state.creates_of(KIE_TASK_KINDS):
        task = sb.state.get(task_id) if task_id else None
        if task is not None and task.scenario.outcome != "fail":
            spent += task_credits(kind)
    return sb.state.spend.get("kie_start_credits", START_CREDITS) - spent


def credit(sb: SandboxCore, req: Request) -> Response:
    return json_response(200, sandbox_shapes.kie_envelope(balance(sb)), delay_s=sb.latency_s)


ROUTES = (Route("GET", "/kie/api/v1/chat/credit".__eq__, credit),)
