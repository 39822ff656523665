"""The pure poll parser: every documented state of every family, and nothing but our errors escapes."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recon_dagster.core.kinds import ASYNC_KINDS, KIND_NAMES, SYNC_KINDS, UnknownProviderKind
from recon_dagster.providers import (
    MediaRef,
    ProviderProtocolError,
    UpstreamState,
    UpstreamStatus,
    parse_poll_response,
)
from recon_dagster.providers.kie.parse import KieEnvelopeError
from recon_dagster_tests.support.poll_bodies import IMG, NF, E, F, R, S, kie, pred

VID = "https://cdn.example.com/v/abc.mp4"


def market(state, **extra):
    return kie({"taskId": "t-1", "model": "nano-banana-pro", "state": state, **extra})


# --- KIE market jobs --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["kie-standard", "kie-kling3", "kie-lip-sync"])
@pytest.mark.parametrize("state", ["waiting", "queuing", "generating"])
def test_market_running_states(kind, state):
    s = parse_poll_response(kind, market(state, progress=92))
    assert (s.state, s.task_id, s.progress, s.media) == (R, "t-1", 92, ())
    assert not s.terminal


def test_market_waiting_with_filled_result_json_is_still_running():
    # A documented example: a waiting task already carrying resultJson. Only the state field counts.
    s = parse_poll_response("kie-standard", market("waiting", resultJson=json.dumps({"resultUrls": [IMG]})))
    assert s.state is R and s.media == ()


def test_market_success_with_urls():
    body = market("success", resultJson=json.dumps({"resultUrls": [IMG, VID]}), costTime=12)
    s = parse_poll_response("kie-standard", body)
    assert s.state is S and s.terminal
    assert s.media == (MediaRef(url=IMG, kind="image"), MediaRef(url=VID, kind="video"))
    assert s.raw == body


def test_market_success_with_text_result_object():
    body = market("success", resultJson=json.dumps({"resultObject": {"text": "hi"}}))
    s = parse_poll_response("kie-standard", body)
    assert (s.state, s.result, s.media) == (S, {"text": "hi"}, ())


def test_market_fail_carries_code_and_message():
    s = parse_poll_response("kie-lip-sync", market("fail", failCode="501", failMsg="content policy"))
    assert s.state is F and s.error == "501: content policy"


def test_market_fail_without_message_still_fails():
    s = parse_poll_response("kie-standard", market("fail", failCode=None, failMsg=None))
    assert s.state is F and s.error


@pytest.mark.parametrize(
    "result_json",
    ["not json", json.dumps([IMG]), json.dumps({"resultUrls": []}), json.dumps({"resultUrls": ["ftp://x/y"]}),
     json.dumps({"other": 1}), None],
)  # fmt: skip
def test_market_success_with_unusable_result_is_protocol_error(result_json):
    with pytest.raises(ProviderProtocolError, match="kie-standard.*resultJson"):
        parse_poll_response("kie-standard", market("success", resultJson=result_json))


@pytest.mark.parametrize("state", ["SUCCESS", "done", None, 3, "succeeded"])
def test_market_unknown_state_names_kind_and_value(state):
    with pytest.raises(ProviderProtocolError) as info:
        parse_poll_response("kie-kling3", market(state))
    assert "kie-kling3" in str(info.value) and repr(state) in str(info.value)


# --- KIE envelope -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [k for k in ASYNC_KINDS if k.startswith("kie-")])
def test_kie_record_info_null_is_not_found(kind):
    s = parse_poll_response(kind, {"code": 422, "msg": "recordInfo is null", "data": None}, task_id="t-9")
    assert (s.state, s.task_id) == (NF, "t-9") and s.terminal


def test_kie_422_with_message_key_and_data_null_is_not_found():
    s = parse_poll_response("kie-veo", {"code": 422, "message": "recordInfo is null", "data": None})
    assert s.state is NF


def test_kie_422_with_data_null_and_another_message_is_an_error_not_not_found():
    with pytest.raises(KieEnvelopeError):
        parse_poll_response("kie-veo", {"code": 422, "message": "whatever", "data": None})


@pytest.mark.parametrize("code", [400, 401, 402, 404, 429, 433, 455, 500, 501, 505])
def test_kie_error_codes_raise_envelope_error(code):
    with pytest.raises(KieEnvelopeError) as info:
        parse_poll_response("kie-standard", {"code": code, "message": "Insufficient credits", "data": None})
    assert info.value.code == code and "Insufficient credits" in str(info.value)
    assert isinstance(info.value, ProviderProtocolError)


def test_kie_422_with_other_message_and_data_is_an_error_not_not_found():
    with pytest.raises(KieEnvelopeError):
        parse_poll_response("kie-standard", {"code": 422, "msg": "taskId invalid", "data": {"x": 1}})


@pytest.mark.parametrize(
    "body",
    [{}, {"code": "200", "data": {}}, {"code": True, "data": {}}, {"code": 200}, {"code": 200, "data": []}],
)
def test_kie_malformed_envelope(body):
    with pytest.raises(ProviderProtocolError):
        parse_poll_response("kie-standard", body)


# --- Veo / Kontext / Luma ---------------------------------------------------------------------


def flag(value, **extra):
    return kie({"taskId": "t-2", "successFlag": value, **extra})


VEO_RESP = {"response": {"resultUrls": [VID], "originUrls": [VID]}}


@pytest.mark.parametrize(
    ("kind", "value", "state"),
    [
        ("kie-veo", 0, R), ("kie-veo", 1, S), ("kie-veo", 2, F), ("kie-veo", 3, F),
        ("kie-luma", 0, R), ("kie-luma", 1, S), ("kie-luma", 2, F), ("kie-luma", 3, F), ("kie-luma", 4, S),
    ],
)  # fmt: skip
def test_veo_and_luma_success_flags(kind, value, state):
    s = parse_poll_response(kind, flag(value, errorCode=400, errorMessage="bad prompt", **VEO_RESP))
    assert s.state is state
    if state is S:
        assert s.media == (MediaRef(url=VID, kind="video"),)
    if state is F:
        assert s.error == "400: bad prompt"


@pytest.mark.parametrize(("value", "state"), [(0, R), (1, S), (2, F), (3, F)])
def test_kontext_success_flags(value, state):
    s = parse_poll_response("kie-kontext", flag(value, response={"resultImageUrl": IMG}, errorMessage="x"))
    assert s.state is state
    if state is S:
        assert s.media == (MediaRef(url=IMG, kind="image"),)


@pytest.mark.parametrize(
    ("kind", "value"), [("kie-veo", 4), ("kie-kontext", 4), ("kie-luma", 5), ("kie-veo", -1)]
)
def test_unknown_success_flag(kind, value):
    with pytest.raises(ProviderProtocolError, match=f"{kind}.*successFlag {value}"):
        parse_poll_response(kind, flag(value, **VEO_RESP))


@pytest.mark.parametrize("value", ["1", 1.0, True, None])
def test_success_flag_wrong_type(value):
    with pytest.raises(ProviderProtocolError, match="successFlag"):
        parse_poll_response("kie-veo", flag(value, **VEO_RESP))


def test_veo_success_without_urls_is_protocol_error():
    with pytest.raises(ProviderProtocolError, match="resultUrls"):
        parse_poll_response("kie-veo", flag(1, response={"resultUrls": []}))


# --- Suno -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "state"),
    [("PENDING", R), ("TEXT_SUCCESS", R), ("FIRST_SUCCESS", R), ("SUCCESS", S), ("CREATE_TASK_FAILED", F),
     ("GENERATE_AUDIO_FAILED", F), ("CALLBACK_EXCEPTION", S), ("SENSITIVE_WORD_ERROR", F)],
)  # fmt: skip
def test_suno_statuses(status, state):
    tracks = [{"id": "a", "audioUrl": "https://cdn.x/a.mp3"}, {"id": "b", "audioUrl": "https://cdn.x/b.mp3"}]
    s = parse_poll_response(
        "kie-suno", kie({"taskId": "s1", "status": status, "response": {"sunoData": tracks}})
    )
    assert s.state is state
    if state is S:
        assert [m.url for m in s.media] == ["https://cdn.x/a.mp3", "https://cdn.x/b.mp3"]
        assert {m.kind for m in s.media} == {"audio"}
    if state is F:
        assert status in s.error


def test_suno_success_with_track_missing_audio_url():
    body = kie({"status": "SUCCESS", "response": {"sunoData": [{"id": "a"}]}})
    with pytest.raises(ProviderProtocolError, match=r"sunoData\[0\]\.audioUrl"):
        parse_poll_response("kie-suno", body)


# --- Runway -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "expire", "expected"),
    [("wait", 0, R), ("queueing", 0, R), ("generating", 0, R), ("success", 0, S), ("success", 1, E),
     ("fail", 0, F)],
)  # fmt: skip
def test_runway_states(state, expire, expected):
    body = kie({"taskId": "r1", "state": state, "expireFlag": expire, "failMsg": "nope",
                "videoInfo": {"videoId": "v", "videoUrl": VID, "imageUrl": IMG}})  # fmt: skip
    s = parse_poll_response("kie-runway", body)
    assert s.state is expected
    if expected is S:
        assert s.media == (MediaRef(url=VID, kind="video"),)


def test_runway_spelling_is_not_market_spelling():
    with pytest.raises(ProviderProtocolError, match="'queuing'"):
        parse_poll_response("kie-runway", kie({"state": "queuing"}))


# --- Replicate --------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["starting", "processing"])
def test_replicate_running(status):
    assert parse_poll_response("replicate-prediction", pred(status)).state is R


@pytest.mark.parametrize("status", ["failed", "canceled", "aborted"])
def test_replicate_failed(status):
    s = parse_poll_response("replicate-prediction", pred(status, error="CUDA out of memory"))
    assert s.state is F and "CUDA out of memory" in s.error and status in s.error


def test_replicate_succeeded_list_of_urls_and_predict_time():
    s = parse_poll_response(
        "replicate-prediction", pred("succeeded", output=[IMG, VID], metrics={"predict_time": 4.5})
    )
    assert s.state is S and [m.url for m in s.media] == [IMG, VID] and s.predict_time_s == 4.5
    assert s.task_id == "p1"


def test_replicate_succeeded_single_url():
    s = parse_poll_response("replicate-prediction", pred("succeeded", output=VID))
    assert s.media == (MediaRef(url=VID, kind="video"),)


def test_replicate_text_output_is_a_result_not_media():
    s = parse_poll_response("replicate-prediction", pred("succeeded", output=["Hel", "lo"]))
    assert (s.state, s.media, s.result) == (S, (), {"output": ["Hel", "lo"]})


@pytest.mark.parametrize(
    "extra", [{"output": None, "data_removed": True}, {"output": [IMG], "data_removed": True}]
)
def test_replicate_removed_outputs_are_expired(extra):
    assert parse_poll_response("replicate-prediction", pred("succeeded", **extra)).state is E


def test_replicate_training_weights():
    out = {"version": "owner/model:abc", "weights": "https://replicate.delivery/x/trained.tar"}
    s = parse_poll_response("replicate-training", pred("succeeded", output=out))
    assert s.media == (MediaRef(url=out["weights"], kind="weights"),)
    assert s.result == {"version": "owner/model:abc"}


def test_replicate_training_without_weights_is_protocol_error():
    with pytest.raises(ProviderProtocolError, match="output.weights"):
        parse_poll_response("replicate-training", pred("succeeded", output={"version": "v"}))


@pytest.mark.parametrize("status", ["queued", "SUCCEEDED", None, 1])
def test_replicate_unknown_status(status):
    with pytest.raises(ProviderProtocolError, match=r"replicate-prediction: unknown status"):
        parse_poll_response("replicate-prediction", pred(status))


def test_replicate_data_removed_wrong_type():
    with pytest.raises(ProviderProtocolError, match="data_removed"):
        parse_poll_response("replicate-prediction", pred("succeeded", output=[IMG], data_removed="yes"))


# --- ElevenLabs -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["preparing", "dubbing"])
def test_dubbing_running(status):
    assert parse_poll_response("elevenlabs-async", {"dubbing_id": "d1", "status": status}).state is R


def test_dubbed_gives_authenticated_byte_endpoint_for_first_target_language():
    body = {"dubbing_id": "d1", "name": "x", "status": "dubbed", "target_languages": ["es", "fr"]}
    s = parse_poll_response("elevenlabs-async", body)
    assert s.state is S
    assert s.media == (MediaRef(url="/v1/dubbing/d1/audio/es", kind="audio", needs_auth=True),)


def test_dubbed_uses_task_id_when_body_has_no_id():
    s = parse_poll_response("elevenlabs-async", {"status": "dubbed", "target_lang": "de"}, task_id="d/2")
    assert s.media[0].url == "/v1/dubbing/d%2F2/audio/de" and s.task_id == "d/2"


def test_dubbed_without_language_is_protocol_error():
    with pytest.raises(ProviderProtocolError, match="language"):
        parse_poll_response("elevenlabs-async", {"dubbing_id": "d1", "status": "dubbed"})


def test_dubbing_failed():
    s = parse_poll_response(
        "elevenlabs-async", {"dubbing_id": "d1", "status": "failed", "error": "no speech"}
    )
    assert (s.state, s.error) == (F, "no speech")


# --- General ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_sync_kinds_have_nothing_to_poll(kind):
    with pytest.raises(ProviderProtocolError, match=f"{kind}.*synchronous"):
        parse_poll_response(kind, {"status": "succeeded"})


def test_unknown_kind_is_a_caller_error():
    with pytest.raises(UnknownProviderKind):
        parse_poll_response("kie-nope", {})


@pytest.mark.parametrize("body", [None, [], "x", 3])
def test_non_object_body(body):
    with pytest.raises(ProviderProtocolError, match="JSON object"):
        parse_poll_response("replicate-prediction", body)


def test_unknown_extra_fields_are_tolerated():
    body = pred("succeeded", output=[IMG], brand_new_field={"nested": [1, 2]})
    assert parse_poll_response("replicate-prediction", body).state is S


def test_huge_offending_value_is_shown_bounded():
    with pytest.raises(ProviderProtocolError) as info:
        parse_poll_response("kie-standard", market("x" * 100_000))
    assert len(str(info.value)) < 400


# --- Property: any JSON-like body, any kind -> UpstreamStatus or ProviderProtocolError ---------

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_like = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)
_known_values = st.sampled_from(
    ["waiting", "queuing", "generating", "success", "fail", "wait", "queueing", "PENDING", "SUCCESS",
     "CALLBACK_EXCEPTION", "starting", "processing", "succeeded", "failed", "canceled", "aborted",
     "preparing", "dubbing", "dubbed", 0, 1, 2, 3, 4, 200, 422, "recordInfo is null"]
)  # fmt: skip
value = _known_values | json_like
_keys = ["code", "msg", "message", "data", "state", "successFlag", "status", "resultJson", "response",
         "resultUrls", "resultImageUrl", "sunoData", "audioUrl", "videoInfo", "videoUrl", "expireFlag",
         "output", "data_removed", "metrics", "weights", "dubbing_id", "target_languages", "target_lang",
         "error", "failCode", "failMsg", "progress", "id", "taskId"]  # fmt: skip
shaped = st.recursive(
    value,
    lambda children: (
        st.dictionaries(st.sampled_from(_keys), children, max_size=6)
        | st.lists(children, max_size=3)
        | st.builds(
            lambda d: json.dumps(d),
            st.dictionaries(st.sampled_from(["resultUrls", "resultObject"]), children),
        )
    ),
    max_leaves=25,
)
bodies = st.dictionaries(st.sampled_from(_keys), shaped, max_size=7) | st.dictionaries(st.text(), json_like)
kie_bodies = st.builds(
    lambda code, data, msg: {"code": code, "msg": msg, "data": data},
    st.sampled_from([200, 200, 200, 422, 429, 500]) | json_like,
    st.dictionaries(st.sampled_from(_keys), shaped, max_size=7) | json_like,
    _known_values | json_like,
)


def _templates():
    """One valid body per family and outcome, to be mutated: random JSON alone rarely gets past the envelope."""
    rj = json.dumps({"resultUrls": [IMG]})
    kie_market = [market(st_, resultJson=rj, failMsg="x") for st_ in ("waiting", "success", "fail")]
    kie_market.append(market("success", resultJson=json.dumps({"resultObject": {"t": 1}})))
    flags = [flag(v, response={"resultUrls": [VID], "resultImageUrl": IMG}) for v in range(5)]
    suno = [kie({"status": s_, "response": {"sunoData": [{"audioUrl": "https://c/a.mp3"}]}})
            for s_ in ("PENDING", "SUCCESS", "SENSITIVE_WORD_ERROR")]  # fmt: skip
    runway = [kie({"state": s_, "expireFlag": e, "videoInfo": {"videoUrl": VID}})
              for s_, e in (("wait", 0), ("success", 0), ("success", 1), ("fail", 0))]  # fmt: skip
    rep = [pred(s_, output=o, metrics={"predict_time": 1.5}) for s_, o in
           (("starting", None), ("succeeded", [IMG]), ("succeeded", VID), ("succeeded", {"weights": IMG}),
            ("failed", None), ("succeeded", None))]  # fmt: skip
    rep.append(pred("succeeded", output=None, data_removed=True))
    dub = [
        {"dubbing_id": "d", "status": s_, "target_languages": ["es"]}
        for s_ in ("dubbing", "dubbed", "failed")
    ]
    return [
        *((k, b) for k in ("kie-standard", "kie-kling3", "kie-lip-sync") for b in kie_market),
        *((k, b) for k in ("kie-veo", "kie-kontext", "kie-luma") for b in flags),
        *(("kie-suno", b) for b in suno),
        *(("kie-runway", b) for b in runway),
        *((k, b) for k in ("replicate-prediction", "replicate-training") for b in rep),
        *(("elevenlabs-async", b) for b in dub),
    ]


def _paths(node, prefix=()):
    yield prefix
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _paths(child, (*prefix, key))


def _replace(node, path, new):
    if not path:
        return new
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[path[0]] = _replace(node[path[0]], path[1:], new)
    return copy


@st.composite
def mutated(draw):
    kind, body = draw(st.sampled_from(_templates()))
    if draw(st.booleans()):
        kind = draw(st.sampled_from(KIND_NAMES))
    for _ in range(draw(st.integers(0, 2))):
        path = draw(st.sampled_from(list(_paths(body))))
        body = _replace(body, path, draw(value))
    if not isinstance(body, dict):
        body = {"data": body}
    return kind, body


def _check(kind, body):
    try:
        status = parse_poll_response(kind, body)
    except ProviderProtocolError as exc:
        assert kind in str(exc)
        return "error"
    assert isinstance(status, UpstreamStatus)
    assert status.provider_kind == kind and status.raw == body
    if status.state is UpstreamState.SUCCEEDED:
        # A success always carries something to deliver: media, or a non-empty result.
        assert status.media or status.result
    return status.state.value


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KIND_NAMES), body=bodies | kie_bodies | json_like)
@pytest.mark.slow
def test_parser_never_raises_anything_else(kind, body):
    _check(kind, body)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated())
@pytest.mark.slow
def test_parser_never_raises_anything_else_near_valid_bodies(case):
    _check(*case)


def test_every_template_parses_to_a_status():
    # Guards the mutation strategy itself: unmutated templates must reach every outcome.
    outcomes = {_check(kind, body) for kind, body in _templates()}
    assert outcomes >= {"running", "succeeded", "failed", "expired"}
