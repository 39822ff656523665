"""Pure decisions over what an answer proves: which jobs promise media, when a success is usable,
and the per-provider not-found breaker."""

from __future__ import annotations

import pytest

from recon_dagster.core.kinds import ASYNC_KINDS
from recon_dagster.providers import UpstreamState
from recon_dagster.providers.status import UpstreamStatus
from recon_dagster.reconcile.decide import (
    Action,
    BreakerPolicy,
    decide_on_status,
    describe_result,
    not_found_breaker_open,
    promised_kind,
    promised_media,
    unusable_result,
)

NF = UpstreamState.NOT_FOUND


# --- which jobs promise media ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind", [k for k in ASYNC_KINDS if k not in ("kie-standard", "replicate-prediction")]
)
@pytest.mark.parametrize("job_type", ["image", "video", "text", "prompt-enhance", "whatever"])
def test_media_only_kinds_always_promise_media(kind, job_type):
    assert promised_media(kind, job_type)


@pytest.mark.parametrize("kind", ["kie-standard", "replicate-prediction"])
@pytest.mark.parametrize(
    ("job_type", "promised"),
    [("image", True), ("image-ai", True), ("video", True), ("lip-sync", True), ("suno-voice-create", True),
     ("audio", True), ("lora-training", True), ("text", False), ("prompt-enhance", False), ("caption", False)],
)  # fmt: skip
def test_text_capable_kinds_promise_what_the_job_type_names(kind, job_type, promised):
    assert promised_media(kind, job_type) is promised


@pytest.mark.parametrize("kind", ["kie-llm", "anthropic-sync", "elevenlabs-sync", None, "no-such-kind"])
def test_kinds_without_a_task_promise_nothing_here(kind):
    # Sync results are not URLs this library fetches; legacy/unknown rows are never finalized by us.
    assert not promised_media(kind, "image")


def test_unusable_result_names_what_is_missing():
    nothing = "upstream succeeded with no media and no result"
    assert unusable_result(media=0, result=None, promised=None) == nothing
    assert unusable_result(media=0, result={}, promised=None) == nothing
    assert unusable_result(media=0, result={"t": 1}, promised=None) is None
    assert unusable_result(media=2, result=None, promised="image") is None


@pytest.mark.parametrize(
    ("promised", "result", "reason"),
    [
        (
            "image",
            {"text": "sandbox text result"},
            'upstream succeeded with no media, only a JSON object of 31 bytes: {"text": "sandbox text result"}, '
            "where an image was promised",
        ),
        ("video", None, "upstream succeeded with no media, only nothing, where a video was promised"),
        (
            "audio",
            "a poem",
            "upstream succeeded with no media, only a text of 6 characters: a poem, where audio was promised",
        ),
        (
            "weights",
            [1, 2],
            "upstream succeeded with no media, only a JSON array of 6 bytes: [1, 2], where model weights was promised",
        ),
        (True, {}, "upstream succeeded with no media, only nothing, where media was promised"),
    ],
)
def test_a_success_without_the_promised_media_says_what_came_instead(promised, result, reason):
    """'the job promised media and none was stored' says nothing of what came; the reason does."""
    assert unusable_result(media=0, result=result, promised=promised) == reason


def test_a_long_result_is_cut_at_its_limit_with_an_ellipsis():
    described = describe_result({"text": "word " * 100})
    assert described.startswith('a JSON object of 512 bytes: {"text": "word word')
    assert described.endswith("…") and len(described.split(": ", 1)[1]) == 80


@pytest.mark.parametrize(
    ("kind", "job_type", "promised"),
    [
        ("kie-standard", "image", "image"),
        ("kie-veo", "video", "video"),
        ("kie-suno", "audio", "audio"),
        ("replicate-training", "lora-training", "weights"),
        ("kie-runway", "upscale", "media"),
        ("replicate-prediction", "text", None),
        ("anthropic-sync", "image", None),
    ],
)
def test_promised_kind_names_what_a_job_can_only_complete_with(kind, job_type, promised):
    assert promised_kind(kind, job_type) == promised


# --- the not-found breaker, as a pure decision ---------------------------------


def _nf(kind="replicate-prediction"):
    return UpstreamStatus(provider_kind=kind, task_id="t", state=NF, error="gone")


@pytest.mark.parametrize(
    ("not_found", "total", "is_open"),
    [(0, 0, False), (1, 1, False), (5, 5, False), (6, 6, True), (6, 11, True), (6, 12, False), (6, 13, False),
     (100, 199, True), (100, 200, False), (500, 500, True)],
)  # fmt: skip
def test_breaker_opens_on_more_than_five_not_found_that_are_most_answers(not_found, total, is_open):
    assert not_found_breaker_open(not_found, total, BreakerPolicy()) is is_open


def test_breaker_thresholds_come_from_the_policy():
    policy = BreakerPolicy(burst=2, share=0.9)
    assert not_found_breaker_open(3, 3, policy)
    assert not not_found_breaker_open(2, 2, policy)
    assert not not_found_breaker_open(9, 10, policy)


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_not_found_fails_at_once_with_the_breaker_closed(kind):
    d = decide_on_status(_nf(kind), breaker_open=False)
    assert d.action is Action.FAIL


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_not_found_counts_an_attempt_with_the_breaker_open(kind):
    d = decide_on_status(_nf(kind), breaker_open=True)
    assert d.action is Action.RETRY_LATER and "breaker" in d.reason


@pytest.mark.parametrize("state", [s for s in UpstreamState if s is not NF])
def test_the_breaker_changes_nothing_but_not_found(state):
    status = UpstreamStatus(provider_kind="kie-veo", state=state, error="x")
    assert decide_on_status(status, breaker_open=True) == decide_on_status(status, breaker_open=False)
