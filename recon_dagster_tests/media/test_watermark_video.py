"""The media of a watermark row (``should_watermark`` true, or NULL: the free-tier
default) is stored watermarked, video included, with real small MP4/WebM files made here with
PyAV, served from loopback and reconciled through the real Reconciler and PostgreSQL. Audio is
stored as it came; media that cannot be watermarked never completes the job."""

from __future__ import annotations

import hashlib
import io
from decimal import Decimal
from pathlib import Path

import av
import pytest
from PIL import Image, ImageChops, ImageStat

from recon_dagster.media.errors import MediaNotVideo
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

MARK = [True, None]
MARK_IDS = ["true", "null-is-free-tier"]
# (kind, job type, container, file name): every video-promising way a provider hands one back.
VIDEOS = [
    ("kie-veo", "video", "mp4", "out.mp4"),
    ("kie-runway", "video", "mp4", "out.mp4"),
    ("kie-lip-sync", "lip-sync", "mp4", "out.mp4"),
    ("kie-kling3", "video", "webm", "out.webm"),
    ("replicate-prediction", "video-wan", "webm", "output.webm"),
    ("replicate-prediction", "video-wan", "mp4", "output"),  # no extension: the job type decides
]


def _frames(data: bytes) -> list[Image.Image]:
    with av.open(io.BytesIO(data)) as c:
        return [f.to_image() for f in c.decode(video=0)]


def _streams(data: bytes) -> tuple[str, list[str], float]:
    with av.open(io.BytesIO(data)) as c:
        return c.format.name, sorted(s.type for s in c.streams), (c.duration or 0) / 1_000_000


def _band_changed(original: Image.Image, marked: Image.Image) -> tuple[float, float]:
    """Mean absolute difference (0-255) inside the lower band and in the top third."""
    w, h = marked.size
    original = original.crop((0, 0, w, h))
    band = (0, h - h // 6 - h // 20, w, h - h // 20)
    top = (0, 0, w, h // 3)
    diff = ImageChops.difference(original.convert("RGB"), marked.convert("RGB"))
    return (
        sum(ImageStat.Stat(diff.crop(band)).mean) / 3,
        sum(ImageStat.Stat(diff.crop(top)).mean) / 3,
    )


def _completed_with(db, job, media_dir) -> bytes:
    row = job_row(db, job)
    assert row["status"] == "completed", row.get("last_error", row)
    assert usage_status(db, job) == "committed"
    (media,) = row["output_data"]["media"]
    assert [str(p.relative_to(media_dir)) for p in stored_files(media_dir)] == [media["key"]]
    data = (Path(media_dir) / media["key"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == media["sha256"]
    return data


@pytest.mark.parametrize("should_watermark", MARK, ids=MARK_IDS)
@pytest.mark.parametrize(("kind", "job_type", "fmt", "name"), VIDEOS)
def test_a_watermark_rows_video_is_stored_watermarked_never_clean(
    db, served, media_dir, kind, job_type, fmt, name, should_watermark
):
    original = sample_video(fmt, frames=24, size=(96, 64), audio=True)
    url = served.add(
        original, f"video/{fmt}" if name.endswith(fmt) else "application/octet-stream", name=name
    )

    _, job, out = reconcile_served(
        db, served, media_dir, kind, job_type, url, should_watermark=should_watermark
    )

    assert out.outcome is Outcome.RECOVERED, out.detail
    stored = _completed_with(db, job, media_dir)
    key = job_row(db, job)["output_data"]["media"][0]["key"]
    # Every video comes back as MP4 (H.264): a WebM too (see media/watermark.py).
    assert ".watermarked." in key and key.endswith(".mp4")
    assert stored != original
    # A valid video of the same shape: streams (audio kept), duration, frame count.
    _, src_streams, src_duration = _streams(original)
    out_format, out_streams, out_duration = _streams(stored)
    assert "mp4" in out_format and out_streams == src_streams == ["audio", "video"]
    assert out_duration == pytest.approx(src_duration, abs=0.2)
    before, after = _frames(original), _frames(stored)
    assert abs(len(after) - len(before)) <= 1 and len(after) >= 20
    # The band is drawn into every frame; the rest of the picture is left as it was.
    for clean, marked in zip(before, after, strict=False):
        band, top = _band_changed(clean, marked)
        assert band > 20 and top < 8, (band, top)


@pytest.mark.parametrize("should_watermark", MARK, ids=MARK_IDS)
def test_a_watermark_rows_image_is_stored_watermarked(db, served, media_dir, should_watermark):
    picture = Image.new("RGB", (120, 90), (30, 160, 90))
    buf = io.BytesIO()
    picture.save(buf, "PNG")
    url = served.add(buf.getvalue(), "image/png", name="0.png")

    _, job, out = reconcile_served(
        db, served, media_dir, "kie-standard", "image", url, should_watermark=should_watermark
    )

    assert out.outcome is Outcome.RECOVERED, out.detail
    stored = _completed_with(db, job, media_dir)
    assert ".watermarked." in job_row(db, job)["output_data"]["media"][0]["key"]
    band, top = _band_changed(picture, Image.open(io.BytesIO(stored)))
    assert band > 20 and top < 1


@pytest.mark.parametrize("should_watermark", [True, None, False], ids=[*MARK_IDS, "false"])
def test_audio_is_stored_as_it_came_whatever_the_row_says(db, served, media_dir, should_watermark):
    with av.open(io.BytesIO(sample_video("mp4", audio=True))) as c:
        assert any(s.type == "audio" for s in c.streams)
    track = b"ID3\x04\x00\x00\x00\x00\x00\x00" + bytes(range(256)) * 64
    url = served.add(track, "audio/mpeg", name="track.mp3")

    _, job, out = reconcile_served(
        db, served, media_dir, "kie-suno", "audio", url, should_watermark=should_watermark
    )

    assert out.outcome is Outcome.RECOVERED, out.detail
    assert _completed_with(db, job, media_dir) == track
    assert ".watermarked." not in job_row(db, job)["output_data"]["media"][0]["key"]


@pytest.mark.parametrize("fmt", ["mp4", "webm"])
def test_an_unwatermarked_rows_video_is_stored_byte_for_byte(db, served, media_dir, fmt):
    original = sample_video(fmt, audio=True)
    url = served.add(original, f"video/{fmt}", name=f"out.{fmt}")

    _, job, out = reconcile_served(db, served, media_dir, "kie-veo", "video", url, should_watermark=False)

    assert out.outcome is Outcome.RECOVERED, out.detail
    assert _completed_with(db, job, media_dir) == original
    assert ".watermarked." not in job_row(db, job)["output_data"]["media"][0]["key"]


def _corrupt_videos() -> dict[str, tuple[bytes, str]]:
    mp4 = sample_video("mp4", frames=24)
    sound_only = io.BytesIO()
    with av.open(sound_only, "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=48000)
        stream.layout = "mono"
        frame = av.AudioFrame(format="fltp", layout="mono", samples=1024)
        frame.planes[0].update(bytes(4096))
        frame.sample_rate, frame.pts = 48000, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return {
        "random-bytes": (hashlib.shake_256(b"noise").digest(50_000), "video/mp4"),
        "truncated-mp4": (mp4[: len(mp4) // 2], "video/mp4"),
        "no-video-stream": (sound_only.getvalue(), "video/mp4"),
        "png-served-as-video": (Image.new("RGB", (8, 8)).tobytes() + b"\x89PNG", "video/webm"),
    }


@pytest.mark.parametrize("case", sorted(_corrupt_videos()))
def test_a_video_that_cannot_be_watermarked_never_completes_the_job(db, served, media_dir, case):
    body, content_type = _corrupt_videos()[case]
    url = served.add(body, content_type, name="out.mp4")

    user, job, out = reconcile_served(db, served, media_dir, "kie-veo", "video", url, should_watermark=None)

    assert out.outcome is Outcome.ERROR, out.detail
    assert "cannot watermark" in out.detail
    row = job_row(db, job)
    assert (row["status"], row["reconcile_attempts"]) == ("processing", 1)
    assert usage_status(db, job) == "reserved" and count(db, "assets", job) == 0
    assert balances(db, user) == (Decimal(80), Decimal(40))
    assert anomaly_reasons(db, job) == ["watermark_failed"]
    assert stored_files(media_dir) == []


def test_watermark_video_refuses_what_is_not_a_video(tmp_path):
    source = tmp_path / "in.mp4"
    source.write_bytes(b"<html>not a video</html>")
    with pytest.raises(MediaNotVideo, match="cannot watermark"):
        watermark_video(str(source), str(tmp_path / "out.mp4"))
