"""fal's queue through our client and parser, against the sandbox over loopback HTTP: model ids
with endpoint paths, the app-level status/result/cancel, the media lifetime asked at submit,
failures with their type, cancel's three answers; and a stuck fal job recovered by the reconciler."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from recon_dagster.core.kinds import get_kind
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import (
    ProviderProtocolError,
    UpstreamState,
    parse_poll_response,
    providers_from_env,
)
from recon_dagster.providers.fal import FalResource
from recon_dagster.providers.fal.client import fal_error_message
from recon_dagster.providers.fal.ids import app_of, split_task_id, task_id_for
from recon_dagster.providers.upstream_tasks import CancelResult, TaskCancelling
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.reconcile.reconciler import Reconciler, ReconcileSettings
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.answers import lease, stale_job
from recon_dagster_tests.support.factories import balances, job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import usage_status

KEY = "fal-test-key"
IMAGE = "fal-ai/flux/dev"
VIDEO = "fal-ai/kling-video/v2/master/text-to-video"


@pytest.fixture(scope="module")
def server() -> Any:
    with SandboxServer(api_key=KEY) as sb:
        yield sb


@pytest.fixture
def sb(server: SandboxServer) -> SandboxServer:
    server.reset()
    return server


def _fal(sb: SandboxServer, key: str = KEY) -> FalResource:
    return FalResource(base_url=sb.provider_base_url("fal"), api_key=key, shared_limits=False)


@pytest.mark.parametrize(
    ("model", "app"),
    [
        ("fal-ai/flux", "fal-ai/flux"),
        ("fal-ai/flux/dev", "fal-ai/flux"),
        (VIDEO, "fal-ai/kling-video"),
        ("workflows/me/my-flow/run", "workflows/me/my-flow"),
    ],
)
def test_the_app_of_a_model_id_is_its_first_two_segments(model: str, app: str) -> None:
    assert app_of(model) == app
    assert split_task_id("fal-image", task_id_for(app, "r-1")) == (app, "r-1")


@pytest.mark.parametrize(
    "model", ["", "flux", "/fal-ai/flux", "fal-ai//flux", "fal-ai/flux/", "workflows/me", None]
)
def test_a_model_id_without_an_app_is_refused_in_one_line(model: Any) -> None:
    with pytest.raises(ValueError, match="owner/app"):
        app_of(model)


@pytest.mark.parametrize(
    ("kind", "model", "media"), [("fal-image", IMAGE, "image"), ("fal-video", VIDEO, "video")]
)
def test_submit_poll_until_completed_then_media_on_the_media_host(sb, kind, model, media) -> None:
    fal = _fal(sb)
    payload = {"model": model, "input": {"prompt": "p", "sandbox_scenario": {"polls_before_done": 2}}}
    task_id = fal.create(kind, payload)
    assert task_id.startswith(app_of(model).replace("/", ":") + ":")
    states = [fal.poll(kind, task_id).state for _ in range(3)]
    assert states == [UpstreamState.RUNNING, UpstreamState.RUNNING, UpstreamState.SUCCEEDED]
    done = fal.poll(kind, task_id)
    assert [m.kind for m in done.media] == [media]
    assert done.media[0].url.startswith(f"{sb.base_url}/media/")
    assert httpx.get(done.media[0].url).status_code == 200


@pytest.mark.parametrize("kind", ["fal-image", "fal-video"])
def test_submit_asks_fal_to_keep_the_media_twice_the_stale_threshold_at_least(sb, kind) -> None:
    fal = _fal(sb)
    task_id = fal.create(kind, {"model": IMAGE if kind == "fal-image" else VIDEO, "input": {"prompt": "p"}})
    asked = json.loads(sb.sandbox.state.get(task_id).meta["lifecycle"])
    pk = get_kind(kind)
    assert pk.media_url_ttl is not None
    assert asked == {"expiration_duration_seconds": int(pk.media_url_ttl.total_seconds())}
    assert 2 * pk.stale_threshold.total_seconds() <= asked["expiration_duration_seconds"]


def test_status_at_the_models_endpoint_path_is_not_the_queues(sb) -> None:
    fal = _fal(sb)
    task_id = fal.create("fal-image", {"model": IMAGE, "input": {"prompt": "p"}})
    request_id = split_task_id("fal-image", task_id)[1]
    wrong = httpx.get(
        f"{sb.base_url}/fal/{IMAGE}/requests/{request_id}/status", headers={"Authorization": f"Key {KEY}"}
    )
    assert wrong.status_code == 404 and wrong.headers["x-fal-error-type"] == "not_found"
    right = httpx.get(
        f"{sb.base_url}/fal/fal-ai/flux/requests/{request_id}/status", headers={"Authorization": f"Key {KEY}"}
    )
    assert right.status_code == 200 and right.json()["status"] in ("IN_QUEUE", "IN_PROGRESS", "COMPLETED")


@pytest.mark.parametrize(
    "fail_state", ["internal_server_error", "generation_timeout", "content_policy_violation"]
)
def test_a_failed_request_is_failed_with_its_error_type(sb, fail_state) -> None:
    task_id = sb.add_task(
        "fal-video",
        Scenario(outcome="fail", polls_before_done=0, fail_state=fail_state, error_message="boom"),
    )
    status = _fal(sb).poll("fal-video", task_id)
    assert status.state is UpstreamState.FAILED and status.error == f"{fail_state}: boom"


def test_an_unknown_request_and_a_foreign_id_are_not_found(sb) -> None:
    fal = _fal(sb)
    assert (
        fal.poll("fal-image", task_id_for("fal-ai/flux", str(uuid.uuid4()))).state is UpstreamState.NOT_FOUND
    )
    assert fal.poll("fal-image", "never-issued-1234").state is UpstreamState.NOT_FOUND


def test_cancel_answers_cancelled_then_already_ended_and_not_found(sb) -> None:
    fal = _fal(sb)
    assert isinstance(fal, TaskCancelling)
    task_id = fal.create(
        "fal-video", {"model": VIDEO, "input": {"sandbox_scenario": {"outcome": "run_forever"}}}
    )
    assert fal.cancel_task("queue", task_id) is CancelResult.CANCELLED
    assert fal.poll("fal-video", task_id).state is UpstreamState.FAILED
    assert fal.cancel_task("queue", task_id) is CancelResult.ALREADY_ENDED
    assert fal.cancel_task("queue", task_id_for("fal-ai/kling-video", "gone")) is CancelResult.NOT_FOUND


def test_a_wrong_key_is_an_http_error_naming_fals_error_type(sb) -> None:
    from recon_dagster.providers import ProviderHTTPError

    with pytest.raises(ProviderHTTPError, match="401: authentication_error: "):
        _fal(sb, key="wrong").create("fal-image", {"model": IMAGE, "input": {}})


def test_the_error_type_header_names_an_error_without_a_body() -> None:
    response = httpx.Response(500, text="upstream died", headers={"X-Fal-Error-Type": "runner_server_error"})
    assert fal_error_message(response) == "runner_server_error"
    typed = httpx.Response(
        422, json={"detail": [{"msg": "field required"}]}, headers={"X-Fal-Error-Type": "validation"}
    )
    assert fal_error_message(typed) == 'validation: [{"msg": "field required"}]'


@pytest.mark.parametrize(
    "body",
    [
        {"status": "RUNNING"},
        {"status": "IN_QUEUE", "queue_position": "first"},
        {"status": "COMPLETED"},
        {"status": "COMPLETED", "response": {"seed": 1}},
        {"status": "COMPLETED", "response": {"images": [{"url": "not a url"}]}},
    ],
)
def test_an_answer_the_parser_cannot_read_raises_naming_the_kind(body) -> None:
    with pytest.raises(ProviderProtocolError, match="fal-image"):
        parse_poll_response("fal-image", body)


def _reconcile_stuck(
    db, sandbox, media_dir, kind: str, job_type: str, scenario: Scenario
) -> tuple[Any, Any, Any]:
    """A stale job of ``kind`` whose fal request (seeded in the sandbox) acts out ``scenario``,
    reconciled once through the real client."""
    task = sandbox.add_task(kind, scenario)
    user, job = stale_job(db, kind, job_type, task_id=task)
    owner = f"run-{uuid.uuid4().hex[:8]}"
    lease(db, [job], owner)
    rec = Reconciler(
        db, providers_from_env(), LocalMediaStore(base_dir=media_dir), settings=ReconcileSettings()
    )
    return user, job, rec.reconcile(job, owner)


def test_a_stuck_fal_video_job_is_recovered_by_the_reconciler(db, sandbox, media_dir) -> None:
    user, job, out = _reconcile_stuck(
        db, sandbox, media_dir, "fal-video", "video", Scenario(polls_before_done=0)
    )
    assert out.outcome is Outcome.RECOVERED, out.detail
    row = job_row(db, job)
    assert row["status"] == "completed" and len(row["output_data"]["media"]) == 1
    assert usage_status(db, job) == "committed"
    assert balances(db, user) == (Decimal(80), Decimal(40))
    assert all((Path(media_dir) / m["key"]).is_file() for m in row["output_data"]["media"])


def test_a_stuck_fal_job_that_failed_upstream_is_failed_and_refunded(db, sandbox, media_dir) -> None:
    scenario = Scenario(outcome="fail", polls_before_done=0)
    user, job, out = _reconcile_stuck(db, sandbox, media_dir, "fal-image", "image", scenario)
    assert out.outcome is Outcome.FAILED, out.detail
    assert job_row(db, job)["status"] == "failed"
    assert balances(db, user) == (Decimal(100), Decimal(50))


def test_the_worker_library_persists_the_fal_task_then_resumes_it_instead_of_submitting_again(
    db, sandbox, media_dir
) -> None:
    from recon_dagster.worker import ProviderResult, finalize_job_with_media, run_or_resume

    user = make_user(db, sub=100, topup=50)
    job = make_job(db, user, job_type="image", provider_kind="fal-image", started_minutes_ago=1)
    reserve(db, job, user, 30, from_sub=20, from_topup=10)
    providers = providers_from_env()
    payload = {"model": IMAGE, "input": {"prompt": "a cat", "sandbox_scenario": {"polls_before_done": 1}}}

    first = run_or_resume(
        job, "fal-image", lambda cb: providers.run("fal-image", payload, on_task_created=cb, poll_interval_s=0.01),
        providers=providers, engine=db,
    )  # fmt: skip
    task_id = job_row(db, job)["provider_task_id"]
    assert first.state is UpstreamState.SUCCEEDED and task_id == first.task_id
    # The worker died before settling: a new one resumes the persisted request, never submits again.
    again = run_or_resume(
        job, "fal-image", lambda cb: pytest.fail("submitted twice"), providers=providers, engine=db
    )
    assert again.state is UpstreamState.SUCCEEDED and sandbox.create_count("fal-image") == 1
    finalize_job_with_media(
        db, LocalMediaStore(base_dir=media_dir), job, ProviderResult.from_status(again), source="worker"
    )
    assert job_row(db, job)["status"] == "completed" and usage_status(db, job) == "committed"


def test_a_deployment_without_fal_key_keeps_working_and_fal_kinds_say_what_to_set(
    monkeypatch, provider_keys
) -> None:
    from recon_dagster.providers import ProviderConfigError

    monkeypatch.delenv("FAL_KEY", raising=False)
    providers = providers_from_env()
    assert providers.fal is None and providers.kie is not None  # the four are wired as before
    with pytest.raises(ProviderConfigError, match="set FAL_KEY"):
        providers.poll("fal-image", task_id_for("fal-ai/flux", "r"))
    monkeypatch.setenv("FAL_KEY", "k")
    assert isinstance(providers_from_env().fal, FalResource)
