"""Re-encoding a watermark row's videos is bounded: duration, frames and pixels
per job (all its videos together) and the encode's wall time, from the documented
``RECON_VIDEO_*`` settings. Past any bound the job is not completed clean: a ``watermark_failed``
anomaly, the attempt counted, nothing stored, the credits still reserved. Real videos made with
PyAV, served over loopback, reconciled through the real Reconciler and PostgreSQL."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from recon_dagster.media.errors import MediaNotVideo
from recon_dagster.media.video_limits import VideoBudget, VideoLimits
from recon_dagster.media.watermark import watermark_video
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.sandbox.media import sample_video
from recon_dagster_tests.support.factories import balances, job_row
from recon_dagster_tests.support.reconcile import count, usage_status
from recon_dagster_tests.support.served_media import (
    anomaly_reasons,
    reconcile_served,
    served_fixture,  # noqa: F401 (the fixture)
    stored_files,
)

pytestmark = pytest.mark.timeout(300)

# Two hours of 16x16 frames, one a second: a few KB to download, cheap per frame, and (re-encoded
# frame by frame without a bound) a job that outlives its lease on a slow codec or a longer video.
HOURS = 2


@pytest.fixture(scope="module")
def small_long_video() -> dict[str, bytes]:
    return {fmt: sample_video(fmt, frames=HOURS * 3600, size=(16, 16), fps=1) for fmt in ("mp4", "webm")}


@pytest.mark.parametrize(
    ("kind", "job_type", "fmt"), [("kie-veo", "video", "mp4"), ("replicate-prediction", "video-wan", "webm")]
)
@pytest.mark.slow
def test_a_small_long_video_is_refused_with_the_default_bounds_not_re_encoded_for_hours(
    db, served, media_dir, small_long_video, kind: str, job_type: str, fmt: str
) -> None:
    url = served.add(small_long_video[fmt], f"video/{fmt}", name=f"out.{fmt}")
    started = time.monotonic()

    user, job, out = reconcile_served(db, served, media_dir, kind, job_type, url, should_watermark=None)

    assert out.outcome is Outcome.ERROR, out.detail  # today: recovered, 7,200 frames re-encoded
    assert "RECON_VIDEO_MAX_DURATION_S" in out.detail
    assert time.monotonic() - started < 60
    row = job_row(db, job)
    assert (row["status"], row["reconcile_attempts"]) == ("processing", 1)
    assert usage_status(db, job) == "reserved" and count(db, "assets", job) == 0
    assert balances(db, user) == (Decimal(80), Decimal(40))
    assert anomaly_reasons(db, job) == ["watermark_failed"]
    assert stored_files(media_dir) == []


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("RECON_VIDEO_MAX_DURATION_S", "5", "seconds of video"),
        ("RECON_VIDEO_MAX_FRAMES", "10", "frames"),
        ("RECON_VIDEO_MAX_PIXELS", str(64 * 48 * 10), "pixels"),
        ("RECON_VIDEO_ENCODE_DEADLINE_S", "0.000001", "seconds of encoding"),
    ],
)
def test_each_documented_bound_ends_the_re_encode_of_a_watermark_row(
    db, served, media_dir, monkeypatch, variable: str, value: str, words: str
) -> None:
    monkeypatch.setenv(variable, value)
    url = served.add(sample_video("webm", frames=24, fps=2), "video/webm", name="out.webm")

    _, job, out = reconcile_served(db, served, media_dir, "kie-kling3", "video", url, should_watermark=True)

    assert out.outcome is Outcome.ERROR and variable in out.detail and words in out.detail, out.detail
    assert job_row(db, job)["reconcile_attempts"] == 1 and usage_status(db, job) == "reserved"
    assert anomaly_reasons(db, job) == ["watermark_failed"] and stored_files(media_dir) == []


def test_a_video_under_every_bound_is_still_watermarked(db, served, media_dir, monkeypatch) -> None:
    for variable, value in (
        ("RECON_VIDEO_MAX_DURATION_S", "30"), ("RECON_VIDEO_MAX_FRAMES", "100"),
        ("RECON_VIDEO_MAX_PIXELS", str(64 * 48 * 100)), ("RECON_VIDEO_ENCODE_DEADLINE_S", "60"),
    ):  # fmt: skip
        monkeypatch.setenv(variable, value)
    url = served.add(sample_video("mp4", frames=24, fps=2), "video/mp4", name="out.mp4")
    _, job, out = reconcile_served(db, served, media_dir, "kie-veo", "video", url, should_watermark=True)
    assert out.outcome is Outcome.RECOVERED, out.detail
    assert ".watermarked." in job_row(db, job)["output_data"]["media"][0]["key"]


def test_the_bounds_are_per_job_across_its_videos(tmp_path) -> None:
    """Two 20 s videos under a 30 s bound: the first is watermarked, the second (40 s in all) refused."""
    budget = VideoBudget(VideoLimits(max_duration_s=30, max_frames=10**6, max_pixels=10**12, max_wall_s=60))
    for n in (1, 2):
        src = tmp_path / f"in{n}.webm"
        src.write_bytes(sample_video("webm", frames=20, size=(16, 16), fps=1))
        if n == 1:
            assert watermark_video(str(src), str(tmp_path / "out1.mkv"), budget=budget)
        else:
            with pytest.raises(MediaNotVideo, match="RECON_VIDEO_MAX_DURATION_S"):
                watermark_video(str(src), str(tmp_path / "out2.mkv"), budget=budget)
    assert 18 <= budget.duration_s <= 21 and budget.frames == 20


def test_a_container_that_declares_no_length_is_bounded_as_it_decodes(tmp_path) -> None:
    """MPEG-TS declares no frame count: the frames bound holds while decoding, not only up front."""
    import av

    src = tmp_path / "in.ts"
    with av.open(str(src), "w", format="mpegts") as out:
        stream = out.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        for i in range(200):
            frame = av.VideoFrame(16, 16, "yuv420p")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    budget = VideoBudget(VideoLimits(max_duration_s=10**6, max_frames=50, max_pixels=10**12, max_wall_s=60))
    with pytest.raises(MediaNotVideo, match="RECON_VIDEO_MAX_FRAMES"):
        watermark_video(str(src), str(tmp_path / "out.mp4"), budget=budget)
    assert budget.frames == 0  # nothing spent by a refused video
