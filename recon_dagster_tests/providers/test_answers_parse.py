"""What a provider answer proves (pure parser and decisions).

Rule: a job is failed and refunded only on a state its provider documents as a terminal failure (or
an unknown task, or media the provider says it deleted). An answer that proves neither success nor
failure is a protocol error: the attempt is counted and the cap still ends the job. A "success"
that carries nothing usable is such an answer too.
"""

from __future__ import annotations

import json

import pytest

from recon_dagster.core.kinds import ASYNC_KINDS, KINDS
from recon_dagster.providers import ProviderProtocolError, parse_poll_response
from recon_dagster.providers.kie.parse import KieEnvelopeError
from recon_dagster_tests.support.poll_bodies import IMG, NF, E, F, S, kie, pred

MP3 = "https://cdn.example.com/a/1.mp3"
KIE_KINDS = [k for k in ASYNC_KINDS if KINDS[k].provider == "kie"]


# --- an answer that is not proof of failure is not a failure -------------------


def _suno(status, tracks):
    return kie({"taskId": "s1", "status": status, "response": {"sunoData": tracks}})


def test_suno_callback_exception_with_tracks_is_recovered():
    tracks = [{"id": "a", "audioUrl": MP3}, {"id": "b", "audioUrl": MP3.replace("1", "2")}]
    s = parse_poll_response("kie-suno", _suno("CALLBACK_EXCEPTION", tracks))
    assert s.state is S and [m.url for m in s.media] == [t["audioUrl"] for t in tracks]
    assert {m.kind for m in s.media} == {"audio"}


@pytest.mark.parametrize(
    "response",
    [None, {}, {"sunoData": []}, {"sunoData": [{"id": "a", "audioUrl": ""}]},
     {"sunoData": [{"id": "a", "audioUrl": MP3}, {"id": "b", "audioUrl": ""}]}],
)  # fmt: skip
def test_suno_callback_exception_without_complete_tracks_is_not_a_failure(response):
    # The callback to the app failed; whether the music exists is not said: not proof of failure.
    body = kie({"taskId": "s1", "status": "CALLBACK_EXCEPTION", "response": response})
    with pytest.raises(ProviderProtocolError, match="CALLBACK_EXCEPTION"):
        parse_poll_response("kie-suno", body)


@pytest.mark.parametrize("status", ["CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED", "SENSITIVE_WORD_ERROR"])
def test_suno_documented_failures_still_fail_even_with_partial_tracks(status):
    s = parse_poll_response("kie-suno", _suno(status, [{"id": "a", "audioUrl": MP3}]))
    assert s.state is F and status in (s.error or "")


@pytest.mark.parametrize("flag", [1, 4])
def test_luma_callback_failed_flag_is_a_success_like_flag_1(flag):
    body = kie({"taskId": "l1", "successFlag": flag, "response": {"resultUrls": [IMG]}})
    assert parse_poll_response("kie-luma", body).state is S


def test_luma_callback_failed_flag_without_media_is_a_protocol_error_not_a_failure():
    body = kie({"taskId": "l1", "successFlag": 4, "response": None})
    with pytest.raises(ProviderProtocolError):
        parse_poll_response("kie-luma", body)


@pytest.mark.parametrize("kind", KIE_KINDS)
@pytest.mark.parametrize("msg_key", ["msg", "message"])
@pytest.mark.parametrize("text", ["recordInfo is null", "RecordInfo is null.", "recordInfo is null "])
def test_kie_documented_no_such_record_is_not_found(kind, msg_key, text):
    s = parse_poll_response(kind, {"code": 422, msg_key: text, "data": None}, task_id="t-9")
    assert (s.state, s.task_id) == (NF, "t-9")


@pytest.mark.parametrize("kind", KIE_KINDS)
@pytest.mark.parametrize(
    "body",
    [kie(None, code=422, msg="whatever"), {"code": 422, "message": "whatever", "data": None},
     kie(None, code=422, msg=""), {"code": 422, "data": None}, kie(None, code=422, msg="taskId is invalid"),
     kie(None, code=422, msg="Validation error: callBackUrl"), kie({"x": 1}, code=422, msg="whatever")],
)  # fmt: skip
def test_kie_other_422s_are_protocol_errors_not_not_found(kind, body):
    with pytest.raises(KieEnvelopeError) as info:
        parse_poll_response(kind, body)
    assert info.value.code == 422 and isinstance(info.value, ProviderProtocolError)


@pytest.mark.parametrize("kind", ["replicate-prediction", "replicate-training"])
@pytest.mark.parametrize("extra", [{"output": None, "data_removed": False}, {"output": None}])
def test_replicate_succeeded_with_null_output_but_data_not_removed_is_not_expired(kind, extra):
    with pytest.raises(ProviderProtocolError, match="output"):
        parse_poll_response(kind, pred("succeeded", **extra))


@pytest.mark.parametrize("kind", ["replicate-prediction", "replicate-training"])
@pytest.mark.parametrize("output", [None, [IMG], {"weights": IMG}])
def test_replicate_data_removed_true_is_expired(kind, output):
    assert parse_poll_response(kind, pred("succeeded", output=output, data_removed=True)).state is E


# --- a success with nothing usable is not a success ---------------------------


@pytest.mark.parametrize(
    "output", [[], {}, "", "   ", [IMG, 5], [IMG, None], [5, IMG], [IMG, "not a url"], [IMG, [IMG]], [""],
               [None], [IMG, {"url": IMG}]],
)  # fmt: skip
def test_replicate_success_with_nothing_usable_is_a_protocol_error(output):
    with pytest.raises(ProviderProtocolError, match="output"):
        parse_poll_response("replicate-prediction", pred("succeeded", output=output))


@pytest.mark.parametrize("result", [{}, None, [], "text", 3])
def test_kie_market_empty_or_non_object_result_object_is_a_protocol_error(result):
    body = kie({"taskId": "m", "state": "success", "resultJson": json.dumps({"resultObject": result})})
    with pytest.raises(ProviderProtocolError, match="resultObject"):
        parse_poll_response("kie-standard", body)


def test_kie_market_text_result_object_stays_a_result():
    body = kie(
        {"taskId": "m", "state": "success", "resultJson": json.dumps({"resultObject": {"text": "hi"}})}
    )
    s = parse_poll_response("kie-standard", body)
    assert (s.state, s.media, s.result) == (S, (), {"text": "hi"})


@pytest.mark.parametrize("output", [["Hel", "lo"], "A caption.", {"answer": 42}])
def test_replicate_text_outputs_stay_results(output):
    s = parse_poll_response("replicate-prediction", pred("succeeded", output=output))
    assert s.state is S and s.media == () and s.result == {"output": output}
