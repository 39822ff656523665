"""The provider sandbox over real loopback HTTP: each async kind's lifecycle and shapes, unknown ids,
injected 429 / 5xx, lost creates and malformed bodies."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from recon_dagster.core.kinds import ASYNC_KINDS
from recon_dagster.sandbox import SandboxServer, Scenario, ScenarioError
from recon_dagster_tests.support.sandbox_api import (
    BEARER,
    CONTENT_TYPE,
    CREATE,
    FAILURE,
    POLL,
    RUNNING,
    SUCCESS,
    create,
    headers_for,
    media_urls,
    poll,
    state_of,
)


def test_every_async_kind_is_covered() -> None:
    assert set(POLL) == set(ASYNC_KINDS)


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_create_poll_running_then_succeeded_then_media(
    sb: SandboxServer, client: httpx.Client, kind: str
) -> None:
    tid = create(client, kind, {"polls_before_done": 3})
    seen = [state_of(kind, poll(client, kind, tid).json()) for _ in range(3)]
    assert seen == RUNNING[kind]
    body = poll(client, kind, tid).json()
    assert state_of(kind, body) == SUCCESS[kind]
    urls = media_urls(kind, body, sb, tid)
    assert urls and all(u.startswith(sb.base_url) for u in urls)
    # Polling again after the end stays terminal.
    assert state_of(kind, poll(client, kind, tid).json()) == SUCCESS[kind]
    media = client.get(urls[0], headers=headers_for(kind))
    assert media.status_code == 200
    assert media.headers["content-type"] == CONTENT_TYPE[kind]
    assert len(media.content) == int(media.headers["content-length"]) > 0
    assert sb.create_count(kind) == 1
    assert sb.poll_count(tid) == 5
    assert sb.media_downloads(tid) == 1


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_failure_scenario_uses_documented_failure_value(
    client: httpx.Client, sb: SandboxServer, kind: str
) -> None:
    tid = sb.add_task(kind, Scenario(outcome="fail", polls_before_done=0, error_message="boom"))
    body = poll(client, kind, tid).json()
    assert state_of(kind, body) == FAILURE[kind]
    assert "boom" in json.dumps(body)


def test_market_failure_carries_fail_code_and_message(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-standard", Scenario(outcome="fail", polls_before_done=0, error_message="nsfw"))
    data = poll(client, "kie-standard", tid).json()["data"]
    assert data["failCode"] and data["failMsg"] == "nsfw" and data["resultJson"] == ""


@pytest.mark.parametrize(
    ("kind", "fail_state", "expected"),
    [
        ("kie-veo", "2", 2),
        ("kie-suno", "SENSITIVE_WORD_ERROR", "SENSITIVE_WORD_ERROR"),
        ("replicate-prediction", "aborted", "aborted"),
        ("replicate-training", "canceled", "canceled"),
    ],
)
def test_fail_state_picks_another_documented_value(
    client: httpx.Client, sb: SandboxServer, kind: str, fail_state: str, expected: Any
) -> None:
    tid = sb.add_task(kind, Scenario(outcome="fail", polls_before_done=0, fail_state=fail_state))
    assert state_of(kind, poll(client, kind, tid).json()) == expected


def test_fail_state_foreign_to_the_family_is_refused(sb: SandboxServer) -> None:
    with pytest.raises(ScenarioError, match="not a failure value of kie-veo"):
        sb.add_task("kie-veo", Scenario(outcome="fail", fail_state="failed"))


def test_luma_callback_failed_reports_success_flag_4(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-luma", Scenario(polls_before_done=0, luma_callback_failed=True))
    data = poll(client, "kie-luma", tid).json()["data"]
    assert data["successFlag"] == 4
    assert data["response"]["resultUrls"] == [sb.media_url(tid)]


def test_suno_partial_states_carry_partial_tracks(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-suno", Scenario(polls_before_done=3, media_count=2))
    assert poll(client, "kie-suno", tid).json()["data"]["response"] is None  # PENDING
    text = poll(client, "kie-suno", tid).json()["data"]["response"]["sunoData"]
    assert [t["audioUrl"] for t in text] == ["", ""]
    first = poll(client, "kie-suno", tid).json()["data"]["response"]["sunoData"]
    assert first[0]["audioUrl"] and not first[1]["audioUrl"]
    done = poll(client, "kie-suno", tid).json()["data"]
    assert done["status"] == "SUCCESS" and all(t["audioUrl"] for t in done["response"]["sunoData"])


def test_market_early_result_fills_result_json_while_waiting(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-standard", Scenario(polls_before_done=1, early_result=True))
    data = poll(client, "kie-standard", tid).json()["data"]
    assert data["state"] == "waiting" and json.loads(data["resultJson"])["resultUrls"]


def test_market_text_result_is_a_result_object(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-standard", Scenario(polls_before_done=0, media_kind="text"))
    result = json.loads(poll(client, "kie-standard", tid).json()["data"]["resultJson"])
    assert "resultObject" in result and "resultUrls" not in result


def test_replicate_output_as_string_and_media_count(client: httpx.Client, sb: SandboxServer) -> None:
    one = sb.add_task("replicate-prediction", Scenario(polls_before_done=0, output_as_string=True))
    assert poll(client, "replicate-prediction", one).json()["output"] == sb.media_url(one)
    three = sb.add_task("replicate-prediction", Scenario(polls_before_done=0, media_count=3))
    out = poll(client, "replicate-prediction", three).json()["output"]
    assert out == [sb.media_url(three, n) for n in range(3)]
    assert client.get(out[2]).status_code == 200
    assert client.get(out[2].replace("/2.png", "/3.png")).status_code == 404


def test_replicate_model_scoped_prediction_and_cancel(client: httpx.Client, sb: SandboxServer) -> None:
    r = client.post(
        "/replicate/v1/models/black-forest-labs/flux-schnell/predictions",
        headers=BEARER,
        json={"input": {"prompt": "p"}, "sandbox_scenario": {"outcome": "run_forever"}},
    )
    assert r.status_code == 201
    pred = r.json()
    assert pred["model"] == "black-forest-labs/flux-schnell"
    assert pred["urls"]["get"] == f"{sb.api_base_url('replicate')}/predictions/{pred['id']}"
    cancel = client.post(pred["urls"]["cancel"], headers=BEARER)
    assert cancel.status_code == 200 and cancel.json()["status"] == "canceled"
    assert poll(client, "replicate-prediction", pred["id"]).json()["status"] == "canceled"


# -- unknown ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [k for k in ASYNC_KINDS if k.startswith("kie")])
def test_kie_unknown_task_is_http_200_code_422(client: httpx.Client, kind: str) -> None:
    r = poll(client, kind, "no-such-task")
    assert r.status_code == 200
    assert r.json() == {"code": 422, "msg": "recordInfo is null", "data": None}


def test_kie_task_polled_on_another_family_endpoint_is_unknown(
    client: httpx.Client, sb: SandboxServer
) -> None:
    tid = sb.add_task("kie-veo")
    assert poll(client, "kie-standard", tid).json()["code"] == 422


@pytest.mark.parametrize("kind", ["replicate-prediction", "replicate-training"])
def test_replicate_unknown_is_404_problem_json(client: httpx.Client, kind: str) -> None:
    r = poll(client, kind, "doesnotexist")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["status"] == 404 and r.json()["detail"]


def test_elevenlabs_unknown_dubbing_is_404_detail(client: httpx.Client) -> None:
    r = poll(client, "elevenlabs-async", "nope")
    assert r.status_code == 404
    detail = r.json()["detail"]
    assert {"type", "code", "message", "request_id"} <= set(detail)


# -- injected 429 / 5xx ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["kie-standard", "kie-veo", "replicate-prediction", "elevenlabs-async"])
def test_rate_limit_first_then_answers(client: httpx.Client, sb: SandboxServer, kind: str) -> None:
    tid = sb.add_task(kind, Scenario(rate_limit_first=2, polls_before_done=0, retry_after_s=3))
    for _ in range(2):
        r = poll(client, kind, tid)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "3"
    if kind.startswith("kie"):
        assert r.json()["code"] == 429
    elif kind.startswith("replicate"):
        assert r.json()["detail"].startswith("Request was throttled")
        assert r.headers["ratelimit-remaining"] == "0" and r.headers["ratelimit-reset"] == "3"
    else:
        assert r.json()["detail"]["code"] == "rate_limit_exceeded"
    ok = poll(client, kind, tid)
    assert ok.status_code == 200 and state_of(kind, ok.json()) == SUCCESS[kind]
    assert sb.poll_count(tid) == 3


@pytest.mark.parametrize(
    ("kind", "status"), [("kie-standard", 500), ("replicate-training", 503), ("elevenlabs-async", 500)]
)
def test_server_error_first_then_answers(
    client: httpx.Client, sb: SandboxServer, kind: str, status: int
) -> None:
    tid = sb.add_task(kind, Scenario(server_error_first=1, polls_before_done=0))
    assert poll(client, kind, tid).status_code == status
    assert poll(client, kind, tid).status_code == 200


def test_throttle_then_server_error_then_answer_in_order(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task(
        "kie-runway", Scenario(rate_limit_first=1, server_error_first=2, server_error_status=503)
    )
    assert [poll(client, "kie-runway", tid).status_code for _ in range(4)] == [429, 503, 503, 200]


def test_kie_errors_in_http_200_envelope(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-kontext", Scenario(rate_limit_first=1, server_error_first=1, http200_errors=True))
    first, second = poll(client, "kie-kontext", tid), poll(client, "kie-kontext", tid)
    assert (first.status_code, first.json()["code"]) == (200, 429)
    assert (second.status_code, second.json()["code"]) == (200, 500)


def test_create_injections_throttle_fail_reject(client: httpx.Client, sb: SandboxServer) -> None:
    sb.set_default_scenario("kie-veo", Scenario(create_rate_limit_first=1, create_server_error_first=1))
    path, body = CREATE["kie-veo"]
    assert client.post(path, headers=BEARER, json=body).status_code == 429
    assert client.post(path, headers=BEARER, json=body).status_code == 500
    assert client.post(path, headers=BEARER, json=body).json()["code"] == 200
    assert sb.create_count("kie-veo") == 1
    sb.set_default_scenario(
        "kie-veo", Scenario(create_reject_status=402, error_message="Insufficient credits")
    )
    r = client.post(path, headers=BEARER, json=body)
    assert r.status_code == 200 and r.json() == {"code": 402, "msg": "Insufficient credits", "data": None}
    assert sb.create_count("kie-veo") == 1


def test_lost_create_response_still_creates_the_task(client: httpx.Client, sb: SandboxServer) -> None:
    path, body = CREATE["replicate-prediction"]
    body = {**body, "input": {"prompt": "job-7f3a"}, "sandbox_scenario": {"create_lost_response_first": 1}}
    with pytest.raises(httpx.RemoteProtocolError):
        client.post(path, headers=BEARER, json=body)
    # The provider did create (and bills) it: exactly what an ambiguous create must not repeat.
    assert sb.create_count("replicate-prediction") == 1
    assert sb.creates_for("job-7f3a") == 1
    assert client.post(path, headers=BEARER, json=body).status_code == 201
    assert sb.creates_for("job-7f3a") == 2


# -- malformed bodies ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["kie-standard", "kie-suno", "replicate-prediction", "elevenlabs-async"])
def test_malformed_truncated_is_not_json(client: httpx.Client, sb: SandboxServer, kind: str) -> None:
    tid = sb.add_task(kind, Scenario(malformed=True, polls_before_done=0))
    r = poll(client, kind, tid)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.content)


@pytest.mark.parametrize("kind", ["kie-standard", "kie-veo", "replicate-training", "elevenlabs-async"])
def test_malformed_unknown_and_missing_state(client: httpx.Client, sb: SandboxServer, kind: str) -> None:
    unknown = sb.add_task(kind, Scenario(malformed=True, malformed_kind="unknown_state"))
    state = state_of(kind, poll(client, kind, unknown).json())
    assert state in (7, "MYSTERY_STATE")
    missing = sb.add_task(kind, Scenario(malformed=True, malformed_kind="missing_state"))
    body = poll(client, kind, missing).json()
    holder = body.get("data") if kind.startswith("kie") else body
    assert not {"state", "successFlag", "status"} & set(holder)


def test_malformed_not_json_is_html(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("kie-luma", Scenario(malformed=True, malformed_kind="not_json"))
    r = poll(client, "kie-luma", tid)
    assert r.headers["content-type"] == "text/html" and r.text.startswith("<html>")
