"""Every poll ends within its overall deadline, whatever the server's pace, and no answer is read
past its decoded size cap, against the loopback sandbox over real HTTP.

Short limits come from the environment (``RECON_POLL_DEADLINE_S``, ``RECON_POLL_MAX_BYTES``), the
way an operator sets them, so the tests run in seconds. pytest-timeout guards against a hang.
"""

from __future__ import annotations

import time

import pytest

from recon_dagster.providers import ProviderHTTPError, providers_from_env
from recon_dagster.sandbox import Scenario

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _process_limits(monkeypatch):
    """These tests are about one exchange's deadline and size, not the account's shared budget
    (which needs the limiter's tables: without them it sends nothing)."""
    monkeypatch.setenv("RECON_LIMITS", "process")


# A poll body is a few hundred bytes: at one byte per 0.5 s it would take minutes in full.
DRIP = Scenario(outcome="run_forever", poll_drip_s=0.5)


@pytest.mark.parametrize("kind", ["kie-standard", "replicate-prediction", "elevenlabs-async"])
@pytest.mark.slow
def test_a_dripping_poll_body_ends_at_the_deadline(sandbox, monkeypatch, kind):
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "2")
    providers = providers_from_env()
    task = sandbox.add_task(kind, DRIP)

    started = time.monotonic()
    with pytest.raises(ProviderHTTPError, match="deadline"):
        providers.poll(kind, task)
    elapsed = time.monotonic() - started

    # Bounded by the deadline (plus scheduling slack), not by the body's length or the read timeout.
    assert elapsed < 2 + 5


@pytest.mark.slow
def test_the_deadline_covers_retries_and_their_waits(sandbox, monkeypatch):
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "2")
    providers = providers_from_env()
    kie = providers.kie.model_copy(update={"max_attempts": 50})
    task = sandbox.add_task("kie-standard", Scenario(server_error_first=1000, retry_after_s=1))

    started = time.monotonic()
    with pytest.raises(ProviderHTTPError, match="deadline"):
        kie.poll("kie-standard", task)
    assert time.monotonic() - started < 2 + 5
    assert sandbox.poll_count(task) < 50  # stopped by the clock, not by the attempt count


def test_a_gzip_bomb_is_refused_at_the_decoded_cap(sandbox, monkeypatch):
    monkeypatch.setenv("RECON_POLL_MAX_BYTES", str(1024 * 1024))
    providers = providers_from_env()
    task = sandbox.add_task("kie-standard", Scenario(poll_gzip_bytes=64 * 1024 * 1024))

    with pytest.raises(ProviderHTTPError, match="larger than 1048576 bytes decoded"):
        providers.poll("kie-standard", task)


@pytest.mark.parametrize("gzip", [False, True])
def test_answers_under_the_limits_are_read_as_before(sandbox, monkeypatch, gzip):
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "5")
    monkeypatch.setenv("RECON_POLL_MAX_BYTES", "4096")
    providers = providers_from_env()
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0, gzip_polls=gzip))

    status = providers.poll("kie-standard", task)

    assert status.state.value == "succeeded" and status.media


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf", "nan"])
def test_a_bad_limit_is_an_error_naming_the_variable(sandbox, monkeypatch, value):
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", value)
    with pytest.raises(ValueError, match="RECON_POLL_DEADLINE_S"):
        providers_from_env().poll("kie-standard", sandbox.add_task("kie-standard"))


def test_a_billed_sync_answer_is_not_held_to_the_poll_cap(sandbox, monkeypatch):
    """A text-to-speech answer is the audio itself: the poll cap must not refuse a paid result."""
    monkeypatch.setenv("RECON_POLL_MAX_BYTES", "1024")
    sandbox.set_default_scenario("elevenlabs-sync", Scenario(media_size=256 * 1024))
    try:
        audio = providers_from_env().elevenlabs.text_to_speech("voice1", "hello there")
    finally:
        sandbox.set_default_scenario("elevenlabs-sync", None)
    assert len(audio) >= 256 * 1024


# --- a timeout says which deadline ---------------------------------------------


@pytest.mark.parametrize("kind", ["kie-standard", "replicate-prediction", "elevenlabs-async"])
def test_a_read_timeout_names_the_read_timeout_and_never_says_http_none(sandbox, monkeypatch, kind):
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "30")
    providers = providers_from_env()
    resource = providers.for_kind(kind).model_copy(update={"read_timeout_s": 0.5, "max_attempts": 1})
    task = sandbox.add_task(kind, Scenario(outcome="run_forever", latency_s=3))

    with pytest.raises(ProviderHTTPError) as caught:
        resource.poll(kind, task)

    message = str(caught.value)
    assert "HTTP None" not in message
    assert "no answer within the 0.5 s read timeout (ReadTimeout)" in message, message
    assert message.startswith(f"{kind}: GET ")


@pytest.mark.slow
def test_the_overall_deadline_names_itself_as_the_poll_deadline(sandbox, monkeypatch):
    monkeypatch.setenv("RECON_POLL_DEADLINE_S", "1")
    providers = providers_from_env()
    task = sandbox.add_task("kie-standard", Scenario(outcome="run_forever", latency_s=4))

    with pytest.raises(ProviderHTTPError) as caught:
        providers.poll("kie-standard", task)

    message = str(caught.value)
    assert "HTTP None" not in message
    assert "1 s poll deadline" in message or "overall deadline of 1 s passed" in message, message


def test_a_refused_connection_says_so_without_an_http_status(monkeypatch):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("KIE_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("KIE_API_KEY", "k")
    kie = providers_from_env().kie.model_copy(update={"max_attempts": 1})

    with pytest.raises(ProviderHTTPError) as caught:
        kie.poll("kie-standard", "task-1")

    message = str(caught.value)
    assert "HTTP None" not in message and "ConnectError" in message, message
