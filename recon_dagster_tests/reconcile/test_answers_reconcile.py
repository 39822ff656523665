"""What a provider answer proves, through the Reconciler on real PostgreSQL: ambiguous answers count an attempt instead of failing, a success without what the job
promised never completes or charges, and the attempt cap still ends every such job with a refund."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from recon_dagster.core.kinds import ASYNC_KINDS, TEXT_RESULT_KINDS
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.decide import Outcome, promised_media
from recon_dagster.reconcile.finalize import (
    ProviderResult,
    UnusableResult,
    finalize_job_with_media,
)
from recon_dagster.reconcile.reconciler import JobOutcome, Reconciler, ReconcileSettings
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.answers import lease, stale_job
from recon_dagster_tests.support.factories import balances, job_row
from recon_dagster_tests.support.poll_bodies import kie
from recon_dagster_tests.support.reconcile import count, usage_status
from recon_dagster_tests.support.served_media import BodyUpstream, success_body

# The job type a media job of each kind would carry in the app.
NATURAL_JOB_TYPE = {
    "kie-standard": "image",
    "kie-veo": "video",
    "kie-suno": "audio",
    "kie-kontext": "image",
    "kie-luma": "video",
    "kie-kling3": "video",
    "kie-runway": "video",
    "kie-lip-sync": "video",
    "replicate-prediction": "image",
    "replicate-training": "lora-training",
    "elevenlabs-async": "audio",
    "fal-image": "image",
    "fal-video": "video",
}
assert set(NATURAL_JOB_TYPE) == set(ASYNC_KINDS)


def _job(db, kind, job_type, *, attempts=0, task_id=None):
    return stale_job(db, kind, job_type, attempts=attempts, task_id=task_id)


def _reconcile(db, upstream, media_dir, job) -> JobOutcome:
    owner = f"run-{uuid.uuid4().hex[:8]}"
    lease(db, [job], owner)
    rec = Reconciler(db, upstream, LocalMediaStore(base_dir=media_dir), settings=ReconcileSettings())
    return rec.reconcile(job, owner)


def _answer(db, media_dir, kind, body, job_type=None, attempts=0):
    """A stale job of ``kind`` whose poll answers ``body``, reconciled once."""
    user, job = _job(db, kind, job_type or NATURAL_JOB_TYPE[kind], attempts=attempts)
    upstream = BodyUpstream()
    upstream.bodies[job_row(db, job)["provider_task_id"]] = body
    return user, job, _reconcile(db, upstream, media_dir, job)


def _untouched_but_counted(db, user, job, attempts=1) -> None:
    row = job_row(db, job)
    assert row["status"] == "processing"
    assert row["reconcile_attempts"] == attempts
    assert usage_status(db, job) == "reserved"
    assert balances(db, user) == (Decimal(80), Decimal(40))
    assert count(db, "assets", job) == 0


# --- an answer that is no proof of failure, through the sandbox and the real clients -------------------------------------------


def test_suno_callback_exception_with_tracks_is_recovered_not_failed(db, sandbox, media_dir):
    task = sandbox.add_task(
        "kie-suno", Scenario(polls_before_done=0, suno_callback_failed=True, media_count=2)
    )
    user, job = _job(db, "kie-suno", "audio", task_id=task)

    out = _reconcile(db, providers_from_env(), media_dir, job)

    assert out.outcome is Outcome.RECOVERED, out.detail
    row = job_row(db, job)
    assert row["status"] == "completed" and len(row["output_data"]["media"]) == 2
    assert usage_status(db, job) == "committed" and count(db, "assets", job) == 1
    assert balances(db, user) == (Decimal(80), Decimal(40))
    assert all((Path(media_dir) / m["key"]).is_file() for m in row["output_data"]["media"])


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("kie-suno", kie({"taskId": "x", "status": "CALLBACK_EXCEPTION", "response": None})),
        ("kie-standard", kie(None, code=422, msg="taskId is invalid")),
        ("kie-veo", {"code": 422, "message": "whatever", "data": None}),
        ("replicate-prediction", {"id": "x", "status": "succeeded", "output": None, "data_removed": False}),
        ("replicate-training", {"id": "x", "status": "succeeded", "output": None}),
        ("kie-luma", kie({"taskId": "x", "successFlag": 4, "response": None})),
    ],
)
def test_an_answer_that_proves_nothing_counts_an_attempt_and_refunds_nothing(db, media_dir, kind, body):
    user, job, out = _answer(db, media_dir, kind, body)

    assert out.outcome is Outcome.ERROR, out.detail
    _untouched_but_counted(db, user, job)


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("kie-veo", kie(None, code=422, msg="recordInfo is null")),
        ("kie-suno", {"code": 422, "message": "recordInfo is null", "data": None}),
        ("replicate-prediction", {"id": "x", "status": "succeeded", "output": None, "data_removed": True}),
        ("kie-suno", kie({"taskId": "x", "status": "GENERATE_AUDIO_FAILED", "response": None})),
    ],
)
def test_documented_failures_still_fail_and_refund_at_once(db, media_dir, kind, body):
    user, job, out = _answer(db, media_dir, kind, body)

    assert out.outcome is Outcome.FAILED, out.detail
    assert job_row(db, job)["status"] == "failed" and usage_status(db, job) == "refunded"
    assert balances(db, user) == (Decimal(100), Decimal(50))


# --- a success with nothing usable ---------------------------------------------

IMG = "https://cdn.example.com/out/0.png"


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("replicate-prediction", {"id": "x", "status": "succeeded", "output": []}),
        ("replicate-prediction", {"id": "x", "status": "succeeded", "output": {}}),
        (
            "replicate-prediction",
            {"id": "x", "status": "succeeded", "output": "Error: NSFW content detected"},
        ),
        ("replicate-prediction", {"id": "x", "status": "succeeded", "output": [IMG, 5]}),
        (
            "kie-standard",
            kie({"taskId": "x", "state": "success", "resultJson": json.dumps({"resultObject": {}})}),
        ),
        (
            "kie-standard",
            kie({"taskId": "x", "state": "success", "resultJson": '{"resultObject": {"t": "hi"}}'}),
        ),
    ],
)
def test_a_success_with_nothing_usable_never_completes_or_charges(db, media_dir, kind, body):
    user, job, out = _answer(db, media_dir, kind, body, "image")

    assert out.outcome is Outcome.ERROR, out.detail
    _untouched_but_counted(db, user, job)
    assert not any(Path(media_dir).rglob("*"))


def test_the_attempt_cap_still_ends_a_job_whose_success_is_unusable(db, media_dir):
    body = {"id": "x", "status": "succeeded", "output": []}
    user, job, out = _answer(db, media_dir, "replicate-prediction", body, "image", attempts=17)

    assert out.outcome is Outcome.EXHAUSTED
    assert job_row(db, job)["status"] == "failed" and usage_status(db, job) == "refunded"
    assert balances(db, user) == (Decimal(100), Decimal(50))
    assert count(db, "credit_anomalies", job) == 1


@pytest.mark.parametrize("kind", sorted(TEXT_RESULT_KINDS))
def test_a_text_result_still_completes_a_text_job(db, media_dir, kind):
    body = (
        kie({"taskId": "x", "state": "success", "resultJson": '{"resultObject": {"text": "a poem"}}'})
        if kind == "kie-standard"
        else {"id": "x", "status": "succeeded", "output": ["a ", "poem"]}
    )
    _, job = _job(db, kind, "prompt-enhance", task_id="x")  # the task the answer is about
    upstream = BodyUpstream()
    upstream.bodies["x"] = body
    out = _reconcile(db, upstream, media_dir, job)

    assert out.outcome is Outcome.RECOVERED, out.detail
    assert job_row(db, job)["status"] == "completed" and usage_status(db, job) == "committed"


@pytest.mark.parametrize("kind", ASYNC_KINDS)
@pytest.mark.parametrize("result", [None, {}, {"text": "words, not the promised media"}])
def test_finalize_refuses_a_media_job_without_media_for_every_kind(db, media_dir, kind, result):
    user, job = _job(db, kind, NATURAL_JOB_TYPE[kind])
    store = LocalMediaStore(base_dir=media_dir)

    with pytest.raises(UnusableResult, match="not completed, nothing charged"):
        finalize_job_with_media(db, store, job, ProviderResult(kind, result=result), source="worker")

    _untouched_but_counted(db, user, job, attempts=0)


# --- property: no malformed success completes a media job without its media stored ---------------

_BAD = [None, [], {}, "", " ", 5, True, "Error: NSFW content detected", "not a url", [""], [None], [5],
        {"url": "x"}, ["ftp://x/y.png"], "ftp://x/y.png"]  # fmt: skip


@st.composite
def success_cases(draw: st.DrawFn) -> tuple[str, str, Any, Any]:
    kind = draw(st.sampled_from(ASYNC_KINDS))
    job_type = draw(st.sampled_from([NATURAL_JOB_TYPE[kind], "text"]))
    good = st.just("URL") | st.lists(st.just("URL"), min_size=1, max_size=2)
    bad = st.sampled_from(_BAD) | st.lists(st.sampled_from(["URL", *_BAD]), min_size=1, max_size=3)
    media = draw(good | bad)
    text = draw(st.none() | st.sampled_from([{}, {"text": "hi"}, "caption", ["a", "b"], []]))
    return kind, job_type, media, text


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=success_cases())
@pytest.mark.slow
def test_no_success_body_completes_a_media_job_without_stored_media(db, sandbox, media_dir, case):
    kind, job_type, media, text = case
    task = sandbox.add_task(kind, Scenario(polls_before_done=0))
    url = sandbox.media_url(task)
    fill = lambda m: url if m == "URL" else m  # noqa: E731
    media = [fill(m) for m in media] if isinstance(media, list) else fill(media)
    user, job = _job(db, kind, job_type)
    upstream = BodyUpstream()
    upstream.bodies[job_row(db, job)["provider_task_id"]] = success_body(kind, url, media, text)

    _reconcile(db, upstream, media_dir, job)

    row = job_row(db, job)
    event(f"{row['status']} (media promised: {promised_media(kind, job_type)})")
    if row["status"] == "completed":
        stored = row["output_data"]["media"]
        if promised_media(kind, job_type):
            assert stored and all((Path(media_dir) / m["key"]).is_file() for m in stored)
        else:
            assert stored or row["output_data"]["result"]
        assert usage_status(db, job) == "committed"
    else:
        assert row["status"] == "processing" or row["error_message"]
        assert usage_status(db, job) in ("reserved", "refunded")
        assert count(db, "assets", job) == 0
