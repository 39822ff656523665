"""Provider resources over real loopback HTTP: the sandbox, plus a tiny stdlib server for edge cases."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import dagster as dg
import pytest

from recon_dagster.core.kinds import ASYNC_KINDS, provider_specs
from recon_dagster.providers import (
    AmbiguousCreateError,
    KieResource,
    PollBudgetExceeded,
    ProviderConfigError,
    ProviderHTTPError,
    ProviderProtocolError,
    ProvidersResource,
    ReplicateResource,
    UpstreamState,
    providers_from_env,
)
from recon_dagster.providers.http import (
    HttpSettings,
    Limits,
    ProviderHttp,
    TokenBucket,
    parse_retry_after,
    shared_limiter,
)
from recon_dagster.providers.resource import api_key_env_vars, resource_class
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.payloads import PAYLOADS

KEY = "sandbox-key"
WRONG_KEY = "sk-wrong-0123456789abcdef"
FAST = {"backoff_initial_s": 0.01, "backoff_max_s": 0.05, "create_rate_per_s": None, "read_rate_per_s": None}


@pytest.fixture(scope="module")
def server() -> Iterator[SandboxServer]:
    with SandboxServer(api_key=KEY) as sb:
        yield sb


@pytest.fixture
def sb(server: SandboxServer) -> SandboxServer:
    server.reset()
    return server


def make(sb: SandboxServer, key: str = KEY, **overrides: Any) -> ProvidersResource:
    """Every registered provider's resource, pointed at the sandbox."""
    opts = {**FAST, **overrides}
    env = sb.env()
    return ProvidersResource(
        **{
            spec.name: resource_class(spec)(base_url=env[spec.settings.base_url_env], api_key=key, **opts)
            for spec in provider_specs()
        }
    )


# --- run / resume across every async kind ------------------------------------------------------


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_run_reports_task_id_once_before_first_poll(sb, kind):
    sb.set_default_scenario(kind, Scenario(polls_before_done=2))
    providers = make(sb)
    created: list[tuple[str, int]] = []
    progress: list[UpstreamState] = []

    status = providers.run(
        kind,
        PAYLOADS[kind],
        on_task_created=lambda tid: created.append((tid, sb.poll_count(tid))),
        on_progress=lambda s: progress.append(s.state),
        poll_interval_s=0.0,
    )

    assert len(created) == 1
    task_id, polls_at_callback = created[0]
    assert polls_at_callback == 0
    assert status.state is UpstreamState.SUCCEEDED and status.task_id == task_id
    assert status.media and all(m.url.startswith(sb.base_url) for m in status.media)
    assert progress == [UpstreamState.RUNNING, UpstreamState.RUNNING, UpstreamState.SUCCEEDED]
    assert sb.poll_count(task_id) == 3
    assert sb.create_count(kind) == 1 and sb.creates_for(task_id) == 1


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_resume_never_creates(sb, kind):
    task_id = sb.add_task(kind, Scenario(polls_before_done=1))
    status = make(sb).resume(kind, task_id, poll_interval_s=0.0)
    assert status.state is UpstreamState.SUCCEEDED and status.task_id == task_id
    assert sb.create_count() == 0 and sb.poll_count(task_id) == 2


def test_failing_callback_stops_before_any_poll(sb):
    seen: list[str] = []

    def boom(task_id: str) -> None:
        seen.append(task_id)
        raise RuntimeError("database down")

    with pytest.raises(RuntimeError, match="database down"):
        make(sb).run("kie-standard", PAYLOADS["kie-standard"], on_task_created=boom)
    assert len(seen) == 1 and sb.poll_count(seen[0]) == 0 and sb.create_count() == 1


@pytest.mark.parametrize("kind", ["kie-veo", "replicate-prediction", "elevenlabs-async"])
def test_upstream_failure_is_a_failed_status(sb, kind):
    task_id = sb.add_task(kind, Scenario(outcome="fail", polls_before_done=0, error_message="model exploded"))
    status = make(sb).poll(kind, task_id)
    assert status.state is UpstreamState.FAILED and "model exploded" in status.error


def test_poll_budget_exhaustion_carries_task_id(sb):
    task_id = sb.add_task("kie-runway", Scenario(outcome="run_forever"))
    with pytest.raises(PollBudgetExceeded) as info:
        make(sb).resume("kie-runway", task_id, poll_interval_s=0.01, budget_s=0.05)
    assert info.value.task_id == task_id and task_id in str(info.value)
    assert info.value.last.state is UpstreamState.RUNNING
    assert sb.create_count() == 0 and sb.poll_count(task_id) >= 1


def test_run_budget_exhaustion_after_create(sb):
    sb.set_default_scenario("replicate-prediction", Scenario(outcome="run_forever"))
    created: list[str] = []
    with pytest.raises(PollBudgetExceeded) as info:
        make(sb).run(
            "replicate-prediction", PAYLOADS["replicate-prediction"], on_task_created=created.append,
            poll_interval_s=0.01, budget_s=0.03,
        )  # fmt: skip
    assert created == [info.value.task_id]


# --- not found, malformed ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["kie-standard", "kie-suno", "replicate-prediction", "replicate-training",
                                  "elevenlabs-async"])  # fmt: skip
def test_unknown_task_is_not_found(sb, kind):
    status = make(sb).poll(kind, "no-such-task")
    assert status.state is UpstreamState.NOT_FOUND and status.task_id == "no-such-task"


@pytest.mark.parametrize("how", ["truncated", "not_json", "unknown_state", "missing_state"])
def test_malformed_poll_body_is_protocol_error(sb, how):
    task_id = sb.add_task("kie-standard", Scenario(malformed=True, malformed_kind=how))
    with pytest.raises(ProviderProtocolError, match="kie-standard"):
        make(sb).poll("kie-standard", task_id)


# --- retries ------------------------------------------------------------------------------------


def _retry_waits(caplog) -> list[float]:
    return [
        float(m.group(1))
        for r in caplog.records
        if (m := re.search(r"retrying in ([0-9.]+) s", r.getMessage()))
    ]


@pytest.mark.slow
def test_429_retry_after_is_honoured_then_succeeds(sb, caplog):
    caplog.set_level(logging.WARNING, logger="recon_dagster.providers")
    task_id = sb.add_task(
        "replicate-prediction", Scenario(polls_before_done=0, rate_limit_first=1, retry_after_s=1)
    )
    status = make(sb).poll("replicate-prediction", task_id)
    assert status.state is UpstreamState.SUCCEEDED
    assert sb.poll_count(task_id) == 2
    waits = _retry_waits(caplog)
    # Our own backoff would have waited at most 0.05 s: the 1 s comes from Retry-After.
    assert len(waits) == 1 and waits[0] >= 1.0


@pytest.mark.parametrize("kind", ["kie-standard", "replicate-training", "elevenlabs-async"])
def test_5xx_is_retried(sb, kind):
    task_id = sb.add_task(kind, Scenario(polls_before_done=0, server_error_first=2))
    status = make(sb).poll(kind, task_id)
    assert status.state is UpstreamState.SUCCEEDED and sb.poll_count(task_id) == 3


@pytest.mark.parametrize("code_kind", ["rate", "server"])
def test_kie_in_envelope_errors_are_retried(sb, code_kind):
    counts = {"rate_limit_first": 1} if code_kind == "rate" else {"server_error_first": 1}
    task_id = sb.add_task(
        "kie-veo", Scenario(polls_before_done=0, http200_errors=True, retry_after_s=0, **counts)
    )
    assert make(sb).poll("kie-veo", task_id).state is UpstreamState.SUCCEEDED
    assert sb.poll_count(task_id) == 2


def test_retries_are_bounded(sb):
    task_id = sb.add_task("replicate-prediction", Scenario(server_error_first=50))
    with pytest.raises(ProviderHTTPError) as info:
        make(sb, max_attempts=3).poll("replicate-prediction", task_id)
    assert info.value.status_code == 503 and sb.poll_count(task_id) == 3


@pytest.mark.parametrize("kind", ["kie-standard", "replicate-prediction", "elevenlabs-async"])
def test_create_rejected_with_429_or_5xx_is_resent_and_creates_once(sb, kind):
    sb.set_default_scenario(
        kind, Scenario(create_rate_limit_first=1, create_server_error_first=1, retry_after_s=0)
    )
    task_id = make(sb).create(kind, PAYLOADS[kind])
    assert sb.create_count(kind) == 1 and sb.creates_for(task_id) == 1


@pytest.mark.parametrize("kind", ["kie-standard", "replicate-training", "elevenlabs-async"])
def test_create_answer_lost_after_read_timeout_is_ambiguous_and_not_resent(sb, kind):
    sb.set_default_scenario(kind, Scenario(latency_s=1.0))
    with pytest.raises(AmbiguousCreateError) as info:
        make(sb, read_timeout_s=0.2).create(kind, PAYLOADS[kind])
    assert kind in str(info.value) and KEY not in str(info.value)
    assert sb.create_count(kind) == 1


def test_create_connection_dropped_is_ambiguous_and_not_resent(sb):
    sb.set_default_scenario("kie-veo", Scenario(create_lost_response_first=1))
    with pytest.raises(AmbiguousCreateError):
        make(sb).create("kie-veo", PAYLOADS["kie-veo"])
    assert sb.create_count("kie-veo") == 1


def test_create_rejection_is_http_error_with_provider_message(sb):
    sb.set_default_scenario(
        "kie-standard", Scenario(create_reject_status=402, error_message="Insufficient credits")
    )
    with pytest.raises(ProviderHTTPError) as info:
        make(sb).create("kie-standard", PAYLOADS["kie-standard"])
    assert info.value.status_code == 402 and "Insufficient credits" in str(info.value)


def test_connection_refused_poll_is_retried_then_reported(sb):
    with SandboxServer(api_key=KEY) as other:
        url = other.api_base_url("kie")
    kie = KieResource(base_url=url, api_key=KEY, max_attempts=2, **FAST)
    with pytest.raises(ProviderHTTPError, match="ConnectError") as info:
        kie.poll("kie-standard", "t1")
    assert info.value.status_code is None


# --- secrets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.poll("kie-standard", "x"),
        lambda p: p.create("replicate-prediction", PAYLOADS["replicate-prediction"]),
        lambda p: p.poll("elevenlabs-async", "x"),
        lambda p: p.anthropic.messages("claude-x", [{"role": "user", "content": "hi"}], 10),
        lambda p: p.kie.chat("gpt-4o", [{"role": "user", "content": "hi"}]),
        lambda p: p.elevenlabs.text_to_speech("voice1", "hello"),
    ],
)
def test_wrong_key_is_a_clear_401_without_the_key(sb, call, caplog):
    caplog.set_level(logging.DEBUG)
    providers = make(sb, key=WRONG_KEY)
    with pytest.raises(ProviderHTTPError) as info:
        call(providers)
    assert info.value.status_code == 401
    text = f"{info.value} {info.value!r}"
    assert WRONG_KEY not in text and re.search(r"access|auth|key|token", text, re.I)
    assert WRONG_KEY not in repr(providers) and WRONG_KEY not in str(providers)
    assert all(WRONG_KEY not in r.getMessage() for r in caplog.records)
    assert sb.create_count() == 0


def test_logs_of_a_whole_run_never_contain_the_key(sb, caplog):
    caplog.set_level(logging.DEBUG)
    task_id = sb.add_task("kie-standard", Scenario(polls_before_done=1, rate_limit_first=1, retry_after_s=0))
    make(sb).resume("kie-standard", task_id, poll_interval_s=0.0)
    assert caplog.records and all(
        KEY not in r.getMessage() and KEY not in str(r.args) for r in caplog.records
    )


def test_missing_env_key_is_a_config_error_naming_the_variable(monkeypatch):
    monkeypatch.delenv("REPLICATE_API_TOKEN", raising=False)
    with pytest.raises(ProviderConfigError, match="REPLICATE_API_TOKEN is not set"):
        providers_from_env().poll("replicate-prediction", "x")


class _EchoHandler(BaseHTTPRequestHandler):
    """Answers 401 echoing the presented key, as some APIs do; or serves a slow OK, counting overlap."""

    inflight = 0
    max_inflight = 0
    lock = threading.Lock()

    def do_GET(self) -> None:
        if self.path.startswith("/echo"):
            body = json.dumps({"detail": f"Invalid token {self.headers.get('Authorization')}"}).encode()
            self._send(401, body)
            return
        cls = type(self)
        with cls.lock:
            cls.inflight += 1
            cls.max_inflight = max(cls.max_inflight, cls.inflight)
        time.sleep(0.05)
        with cls.lock:
            cls.inflight -= 1
        self._send(200, b'{"id": "p1", "status": "processing"}')

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def echo_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _EchoHandler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_key_echoed_by_the_provider_is_redacted(echo_url):
    rep = ReplicateResource(base_url=echo_url, api_key=WRONG_KEY, **FAST)
    with pytest.raises(ProviderHTTPError) as info:
        rep.http.request("GET", "/echo", label="replicate-prediction", idempotent=True)
    assert "Invalid token Bearer [redacted]" in str(info.value) and WRONG_KEY not in str(info.value)


def test_concurrency_limit_holds_across_threads_and_resource_copies(echo_url):
    _EchoHandler.max_inflight = 0
    a = ReplicateResource(base_url=echo_url, api_key=KEY, max_concurrency=2, **FAST)
    b = ReplicateResource(base_url=echo_url, api_key=KEY, max_concurrency=2, **FAST)
    threads = [
        threading.Thread(target=r.poll, args=("replicate-prediction", f"p{i}"))
        for i, r in enumerate([a, b] * 4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1 <= _EchoHandler.max_inflight <= 2


# --- sync calls, media, wiring -------------------------------------------------------------------


def test_sync_calls(sb):
    p = make(sb)
    chat = p.kie.chat("gpt-4o", [{"role": "user", "content": "hi"}])
    assert chat["choices"][0]["message"]["content"]
    msg = p.anthropic.messages("claude-sonnet", [{"role": "user", "content": "hi"}], max_tokens=32)
    assert msg["type"] == "message" and msg["content"][0]["text"]
    audio = p.elevenlabs.text_to_speech("voice1", "hello there")
    assert len(audio) > 1000
    assert sb.create_count("kie-llm") == 1 and sb.create_count("anthropic-sync") == 1
    assert sb.create_count("elevenlabs-sync") == 1


def test_sync_call_retried_on_overload(sb):
    sb.set_default_scenario("anthropic-sync", Scenario(server_error_first=1, server_error_status=529))
    msg = make(sb).anthropic.messages("claude-sonnet", [{"role": "user", "content": "hi"}], max_tokens=8)
    assert msg["type"] == "message"


def test_sync_kinds_cannot_be_polled(sb):
    with pytest.raises(ProviderConfigError, match="synchronous"):
        make(sb).poll("anthropic-sync", "x")


def test_dubbing_media_needs_auth_and_streams_with_the_key(sb):
    media_size = 5000
    task_id = sb.add_task("elevenlabs-async", Scenario(polls_before_done=0, media_size=media_size))
    p = make(sb)
    status = p.poll("elevenlabs-async", task_id)
    (ref,) = status.media
    assert ref.needs_auth and ref.url == sb.media_url(task_id)
    assert p.media_headers("elevenlabs-async", ref) == {"xi-api-key": KEY}
    with p.elevenlabs.open_media(ref) as response:
        assert len(response.read()) == media_size


def test_media_headers_withhold_the_key_from_other_hosts(sb):
    ref = (
        make(sb)
        .poll("elevenlabs-async", sb.add_task("elevenlabs-async", Scenario(polls_before_done=0)))
        .media[0]
    )
    foreign = ref.model_copy(update={"url": "https://evil.example.com/v1/dubbing/x/audio/es"})
    with pytest.raises(ProviderConfigError, match="key withheld"):
        make(sb).media_headers("elevenlabs-async", foreign)
    public = ref.model_copy(update={"needs_auth": False})
    assert make(sb).media_headers("elevenlabs-async", public) == {}


def test_wrong_resource_for_kind_and_bad_payloads(sb):
    p = make(sb)
    with pytest.raises(ProviderConfigError, match="served by the replicate"):
        p.kie.poll("replicate-prediction", "x")
    with pytest.raises(ValueError, match="missing model"):
        p.create("kie-standard", {"input": {}})
    with pytest.raises(ValueError, match="'owner/name'"):
        p.create("replicate-training", {"model": "nope", "version": "v", "destination": "d", "input": {}})
    with pytest.raises(ValueError, match="task_id"):
        p.resume("kie-veo", "")
    assert sb.create_count() == 0


def test_providers_from_env_inside_a_dagster_run(sb, monkeypatch):
    for name, value in sb.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RECON_LIMITS", "process")  # no database here: the shared limiter would refuse
    task_id = sb.add_task("kie-suno", Scenario(polls_before_done=0))
    seen: list[UpstreamState] = []

    @dg.op
    def poll_one(providers: ProvidersResource) -> None:
        seen.append(providers.poll("kie-suno", task_id).state)

    @dg.job
    def one():
        poll_one()

    result = one.execute_in_process(resources={"providers": providers_from_env()})
    assert result.success and seen == [UpstreamState.SUCCEEDED]
    assert KEY not in json.dumps(result.dagster_run.run_config) and KEY not in str(result.dagster_run.tags)


def test_providers_from_env_defaults_to_real_provider_urls(monkeypatch):
    for name in ("KIE_BASE_URL", "REPLICATE_BASE_URL", "ELEVENLABS_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for env in api_key_env_vars():  # a provider without its key is not wired
        monkeypatch.setenv(env, "k")
    p = providers_from_env()
    assert [r.resolved_base_url() for r in (p.kie, p.replicate, p.elevenlabs, p.anthropic)] == [
        "https://api.kie.ai", "https://api.replicate.com/v1", "https://api.elevenlabs.io", "https://api.anthropic.com",
    ]  # fmt: skip


# --- pure pieces of the HTTP layer ------------------------------------------------------------------


def test_token_bucket_bursts_then_paces():
    now = [0.0]
    bucket = TokenBucket(rate_per_s=2.0, burst=20, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(20)] == [0.0] * 20
    assert bucket.reserve() == pytest.approx(0.5)
    assert bucket.reserve() == pytest.approx(1.0)
    now[0] = 10.0  # refilled, but never above the burst
    assert bucket.reserve() == 0.0


def test_parse_retry_after_seconds_and_http_date():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now) == 30.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=30), usegmt=True), now) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_shared_limiter_is_one_per_account_config():
    a = shared_limiter("kie", "http://h/kie/", Limits(max_concurrency=3))
    assert a is shared_limiter("kie", "http://h/kie", Limits(max_concurrency=3))
    assert a is not shared_limiter("kie", "http://h/kie", Limits(max_concurrency=4))


def test_provider_http_repr_hides_headers():
    http = ProviderHttp("kie", "http://127.0.0.1:9", {"Authorization": f"Bearer {WRONG_KEY}"}, WRONG_KEY,
                        HttpSettings(), lambda r: None)  # fmt: skip
    assert WRONG_KEY not in repr(http)
    http.close()


@pytest.mark.slow
def test_kie_in_envelope_429_honours_retry_after_header(sb, caplog):
    caplog.set_level(logging.WARNING, logger="recon_dagster.providers")
    scenario = Scenario(polls_before_done=0, http200_errors=True, rate_limit_first=1, retry_after_s=1)
    task_id = sb.add_task("kie-standard", scenario)
    assert make(sb).poll("kie-standard", task_id).state is UpstreamState.SUCCEEDED
    assert _retry_waits(caplog)[0] >= 1.0


def test_media_headers_withhold_the_key_from_other_paths_on_the_same_host(sb):
    p = make(sb)
    ref = p.poll("elevenlabs-async", sb.add_task("elevenlabs-async", Scenario(polls_before_done=0))).media[0]
    sibling = ref.model_copy(update={"url": f"{sb.base_url}/media/x/0.mp3"})
    with pytest.raises(ProviderConfigError, match="key withheld"):
        p.media_headers("elevenlabs-async", sibling)


@pytest.mark.parametrize(
    ("resource", "window_s", "limit", "which"),
    [
        (KieResource, 10, 20, "create"),
        (ReplicateResource, 60, 600, "create"),
        (ReplicateResource, 60, 3000, "read"),
    ],
)
def test_default_rate_limits_never_exceed_the_documented_window(resource, window_s, limit, which):
    r = resource(api_key=KEY)
    rate, burst = getattr(r, f"{which}_rate_per_s"), getattr(r, f"{which}_burst")
    now = [0.0]
    bucket = TokenBucket(rate, burst, clock=lambda: now[0])
    admitted = 0
    # Greedy client: takes every token as soon as it exists, for one window.
    while True:
        wait = bucket.reserve()
        if now[0] + wait > window_s:
            break
        now[0] += wait
        admitted += 1
    assert limit * 0.8 <= admitted <= limit
