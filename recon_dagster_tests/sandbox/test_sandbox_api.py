"""The provider sandbox as an API: auth in each provider's shape, bad input, counters, the admin API,
the server's lifecycle, the pure scenario decisions and the standalone module."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

from recon_dagster.sandbox import SandboxServer, Scenario, ScenarioError
from recon_dagster.sandbox.scenario import create_action, injected, poll_phase
from recon_dagster_tests.support.sandbox_api import BEARER, CREATE, KEY, XI, create, poll

# -- auth ------------------------------------------------------------------------------------------


def test_auth_rejections_have_each_providers_shape(client: httpx.Client) -> None:
    wrong = "not-the-key-SECRET123"
    kie = client.get("/kie/api/v1/jobs/recordInfo?taskId=x", headers={"Authorization": f"Bearer {wrong}"})
    assert kie.status_code == 401 and kie.json()["code"] == 401
    rep = client.get("/replicate/v1/predictions/x")
    assert rep.status_code == 401 and rep.headers["content-type"] == "application/problem+json"
    assert rep.json()["status"] == 401
    el_missing = client.get("/elevenlabs/v1/dubbing/x")
    el_wrong = client.get("/elevenlabs/v1/dubbing/x", headers={"xi-api-key": wrong})
    assert el_missing.status_code == el_wrong.status_code == 401
    assert el_missing.json()["detail"]["code"] == "missing_api_key"
    assert el_wrong.json()["detail"]["code"] == "invalid_api_key"
    an = client.post("/anthropic/v1/messages", headers={"x-api-key": wrong}, json={})
    assert an.status_code == 401 and an.json()["error"]["type"] == "authentication_error"
    # Anthropic's SDK sends its key as a Bearer token: the right one passes auth (the empty body
    # is then refused as a bad request), a wrong one is refused; no answer echoes a key.
    assert client.post("/anthropic/v1/messages", headers=BEARER, json={}).status_code == 400
    an_bearer = client.post("/anthropic/v1/messages", headers={"Authorization": f"Bearer {wrong}"}, json={})
    assert an_bearer.status_code == 401 and an_bearer.json()["error"]["type"] == "authentication_error"
    for r in (kie, rep, el_wrong, an, an_bearer):
        assert wrong not in r.text and KEY not in r.text


def test_replicate_accepts_legacy_token_scheme(client: httpx.Client, sb: SandboxServer) -> None:
    tid = sb.add_task("replicate-prediction")
    assert (
        client.get(f"/replicate/v1/predictions/{tid}", headers={"Authorization": f"Token {KEY}"}).status_code
        == 200
    )


def test_repr_and_stats_do_not_show_the_key(sb: SandboxServer) -> None:
    assert KEY not in repr(sb)
    assert KEY not in json.dumps(sb.stats())


# -- bad input ---------------------------------------------------------------------------------------


def test_bad_create_bodies_get_provider_validation_errors(client: httpx.Client, sb: SandboxServer) -> None:
    kie = client.post("/kie/api/v1/jobs/createTask", headers=BEARER, content=b"{not json")
    assert kie.status_code == 200 and kie.json()["code"] == 422 and "JSON" in kie.json()["msg"]
    luma = client.post("/kie/api/v1/modify/generate", headers=BEARER, json={"prompt": "p"})
    assert luma.json()["code"] == 422 and "videoUrl" in luma.json()["msg"]
    rep = client.post("/replicate/v1/predictions", headers=BEARER, json={"input": {}})
    assert rep.status_code == 422 and "version" in rep.json()["detail"]
    bad_sc = client.post(
        "/kie/api/v1/veo/generate",
        headers=BEARER,
        json={"prompt": "p", "sandbox_scenario": {"outcome": "explode"}},
    )
    assert bad_sc.json()["code"] == 422 and "outcome" in bad_sc.json()["msg"]
    dub = client.post("/elevenlabs/v1/dubbing", headers=XI, data={"target_lang": "es"})
    assert dub.status_code == 422 and "source_url" in dub.json()["detail"]["message"]
    assert sb.create_count() == 0


def test_scenario_validation_messages() -> None:
    with pytest.raises(ScenarioError, match="polls_before_done"):
        Scenario(polls_before_done=-1)
    with pytest.raises(ScenarioError, match="unknown scenario field"):
        Scenario.from_dict({"outcome": "succeed", "pols_before_done": 1})
    with pytest.raises(ScenarioError, match="media_status"):
        Scenario(media_status=42)
    assert Scenario.from_dict(Scenario(polls_before_done=4).to_dict()) == Scenario(polls_before_done=4)


def test_market_model_routes_to_kind_and_sandbox_kind_overrides(
    client: httpx.Client, sb: SandboxServer
) -> None:
    create(client, "kie-kling3")
    create(client, "kie-lip-sync")
    r = client.post(
        "/kie/api/v1/jobs/createTask",
        headers=BEARER,
        json={"model": "x", "input": {}, "sandbox_kind": "kie-lip-sync"},
    )
    assert r.json()["code"] == 200
    assert (
        sb.create_count("kie-kling3"),
        sb.create_count("kie-lip-sync"),
        sb.create_count("kie-standard"),
    ) == (1, 2, 0)


# -- counters and admin API ------------------------------------------------------------------------


def test_counters(client: httpx.Client, sb: SandboxServer) -> None:
    path, body = CREATE["kie-standard"]
    r = client.post(path, headers=BEARER, json={**body, "callBackUrl": "https://app/cb?job=job-42"})
    tid = r.json()["data"]["taskId"]
    seeded = sb.add_task("kie-standard", Scenario(polls_before_done=0))
    poll(client, "kie-standard", tid)
    poll(client, "kie-standard", seeded)
    poll(client, "kie-standard", seeded)
    client.get(sb.media_url(seeded))
    assert sb.create_count() == sb.create_count("kie-standard") == 1
    assert sb.creates_for(tid) == 1 and sb.creates_for("job-42") == 1 and sb.creates_for(seeded) == 0
    assert (sb.poll_count(tid), sb.poll_count(seeded), sb.poll_count("other")) == (1, 2, 0)
    assert sb.media_downloads(seeded) == 1 and sb.media_downloads(tid) == 0
    assert sb.requests_total() == 5
    sb.reset()
    assert sb.requests_total() == 0 and sb.create_count() == 0 and sb.poll_count(seeded) == 0
    assert poll(client, "kie-standard", seeded).json()["code"] == 422


def test_default_scenario_applies_to_api_creates(client: httpx.Client, sb: SandboxServer) -> None:
    sb.set_default_scenario("kie-kontext", Scenario(outcome="fail", polls_before_done=0))
    tid = create(client, "kie-kontext")
    assert poll(client, "kie-kontext", tid).json()["data"]["successFlag"] == 3
    # The body's own scenario wins over the default.
    tid2 = create(client, "kie-kontext", {"polls_before_done": 0})
    assert poll(client, "kie-kontext", tid2).json()["data"]["successFlag"] == 1


def _raw(sb: SandboxServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(sb.host, sb.port, timeout=10)
    try:
        payload = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_admin_api_from_a_raw_http_client(client: httpx.Client, sb: SandboxServer) -> None:
    status, created = _raw(
        sb,
        "POST",
        "/_sandbox/tasks",
        {"kind": "kie-veo", "scenario": {"polls_before_done": 0}, "task_id": "veo-1"},
    )
    assert status == 201 and created["task_id"] == "veo-1"
    assert created["media_urls"] == [sb.media_url("veo-1")]
    assert poll(client, "kie-veo", "veo-1").json()["data"]["successFlag"] == 1
    status, _ = _raw(
        sb, "POST", "/_sandbox/default_scenario", {"kind": "kie-suno", "scenario": {"outcome": "fail"}}
    )
    assert status == 200
    suno = create(client, "kie-suno")
    status, stats = _raw(sb, "GET", f"/_sandbox/stats?task_id={suno}")
    assert status == 200
    assert stats["creates"] == {"kie-suno": 1} and stats["polls"] == {"veo-1": 1}
    assert stats["task"]["scenario"]["outcome"] == "fail" and stats["creates_for"] == 1
    status, info = _raw(sb, "GET", "/_sandbox/tasks/veo-1")
    assert status == 200 and info["answered_polls"] == 1
    status, found = _raw(sb, "GET", f"/_sandbox/creates?contains={suno}")
    assert found == {"count": 1, "task_ids": [suno]}
    assert _raw(sb, "POST", "/_sandbox/reset")[0] == 200
    assert _raw(sb, "GET", "/_sandbox/stats")[1]["tasks"] == 0


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/_sandbox/tasks", {"kind": "kie-nope"}, "unknown provider_kind"),
        ("/_sandbox/tasks", {"kind": "kie-llm"}, "synchronous"),
        ("/_sandbox/tasks", {"kind": "kie-veo", "scenario": {"bogus": 1}}, "unknown scenario field"),
        ("/_sandbox/tasks", b"[1,", "not valid JSON"),
        ("/_sandbox/default_scenario", {"kind": "kie-veo", "scenario": {"outcome": "x"}}, "outcome"),
    ],
)
def test_admin_bad_input_is_a_clear_400(sb: SandboxServer, path: str, body: Any, needle: str) -> None:
    status, answer = _raw(sb, "POST", path, body)
    assert status == 400 and needle in answer["error"]
    assert sb.stats()["tasks"] == 0


def test_admin_duplicate_task_id_is_refused(sb: SandboxServer) -> None:
    assert _raw(sb, "POST", "/_sandbox/tasks", {"kind": "kie-veo", "task_id": "same"})[0] == 201
    status, answer = _raw(sb, "POST", "/_sandbox/tasks", {"kind": "kie-veo", "task_id": "same"})
    assert status == 400 and "already exists" in answer["error"]


def test_env_points_clients_at_the_sandbox(sb: SandboxServer) -> None:
    env = sb.env()
    assert env["KIE_BASE_URL"] == f"{sb.base_url}/kie"
    assert env["REPLICATE_BASE_URL"].endswith("/replicate/v1")
    assert env["RECON_MEDIA_ALLOWED_HOSTS"] == f"127.0.0.1:{sb.port}"
    assert {
        env[k] for k in ("KIE_API_KEY", "REPLICATE_API_TOKEN", "ELEVENLABS_API_KEY", "ANTHROPIC_API_KEY")
    } == {KEY}


def test_keep_alive_connection_serves_many_requests(sb: SandboxServer) -> None:
    tid = sb.add_task("kie-standard")
    conn = http.client.HTTPConnection(sb.host, sb.port, timeout=10)
    try:
        for _ in range(20):
            conn.request("GET", f"/kie/api/v1/jobs/recordInfo?taskId={tid}", headers=BEARER)
            resp = conn.getresponse()
            assert resp.status == 200 and json.loads(resp.read())["data"]["taskId"] == tid
    finally:
        conn.close()
    assert sb.poll_count(tid) == 20


def test_busy_port_is_a_clear_error_and_restart_works(sb: SandboxServer) -> None:
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{sb.port}"):
        SandboxServer(port=sb.port).start()
    other = SandboxServer(latency_s=0.01).start()
    other.stop()
    other.start()
    try:
        tid = other.add_task("kie-standard", Scenario(polls_before_done=0))
        r = httpx.get(f"{other.api_base_url('kie')}/api/v1/jobs/recordInfo?taskId={tid}", headers=BEARER)
        assert r.json()["data"]["state"] == "success"
    finally:
        other.stop()


# -- pure decisions ----------------------------------------------------------------------------------


def test_injected_series_order() -> None:
    assert [injected(n, 2, 1) for n in range(4)] == ["rate_limited", "rate_limited", "server_error", "answer"]


def test_poll_phase() -> None:
    assert [poll_phase(n, Scenario(polls_before_done=2)) for n in range(3)] == [
        "running",
        "running",
        "succeeded",
    ]
    assert poll_phase(0, Scenario(polls_before_done=0, outcome="fail")) == "failed"
    assert poll_phase(10_000, Scenario(outcome="run_forever")) == "running"


def test_create_action_series() -> None:
    sc = Scenario(create_rate_limit_first=1, create_server_error_first=1, create_lost_response_first=1)
    assert [create_action(n, sc) for n in range(4)] == ["rate_limited", "server_error", "lost", "create"]


# -- standalone ----------------------------------------------------------------------------------------


def test_standalone_module_serves_and_stops() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "recon_dagster.sandbox", "--port", "0", "--api-key", "operator-secret"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("recon-dagster sandbox listening on http://127.0.0.1:")
        base = first.rsplit(" ", 1)[1].strip()
        lines = [proc.stdout.readline() for _ in range(9)]
        assert "KIE_API_KEY=***\n" in lines and not any("operator-secret" in line for line in lines)
        assert httpx.get(f"{base}/_sandbox/health").json()["ok"] is True
        r = httpx.get(
            f"{base}/kie/api/v1/jobs/recordInfo?taskId=x", headers={"Authorization": "Bearer operator-secret"}
        )
        assert r.json()["code"] == 422
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
