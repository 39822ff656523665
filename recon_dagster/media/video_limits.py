"""What re-encoding one job's videos may cost (``RECON_VIDEO_*``), kept apart from the watermark
code so the finalize path reads the settings without loading Pillow or FFmpeg."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from recon_dagster.config import Settings, settings

_DURATION, _FRAMES = Settings.video_max_duration_s, Settings.video_max_frames
_PIXELS, _ENCODE = Settings.video_max_pixels, Settings.video_encode_deadline_s


@dataclass(frozen=True)
class VideoLimits:
    """Bounds on re-encoding the videos of one job (all its videos together): their duration,
    their frames, their pixels (frames x width x height) and the encode's wall time. A small,
    long video (hours of tiny frames) is cheap per frame and endless in all; a long 4K one is
    expensive per frame. Past any bound the job is not completed: ``MediaNotVideo``."""

    max_duration_s: float = _DURATION.default
    max_frames: int = _FRAMES.default
    max_pixels: int = _PIXELS.default
    max_wall_s: float = _ENCODE.default


def video_limits_from_env(environ: Mapping[str, str] | None = None) -> VideoLimits:
    now = settings(environ)
    return VideoLimits(
        now.video_max_duration_s, now.video_max_frames, now.video_max_pixels, now.video_encode_deadline_s
    )


class VideoBudget:
    """What is left of one job's ``VideoLimits`` as its videos are re-encoded, one after another.
    ``deadline`` (monotonic): the finalize's media deadline, which no encode outlives either."""

    def __init__(self, limits: VideoLimits | None = None, *, deadline: float | None = None) -> None:
        self.limits = limits or video_limits_from_env()
        self.deadline = deadline
        self.duration_s = 0.0
        self.frames = 0
        self.pixels = 0
        self.wall_s = 0.0

    def refusal(
        self, *, duration_s: float = 0.0, frames: int = 0, pixels: int = 0, wall_s: float = 0.0
    ) -> str | None:
        """Why re-encoding may not go on once this much more is spent (None: it may)."""
        lim = self.limits
        for spent, bound, what, env in (
            (self.duration_s + duration_s, lim.max_duration_s, "seconds of video", _DURATION.name),
            (self.frames + frames, lim.max_frames, "frames", _FRAMES.name),
            (self.pixels + pixels, lim.max_pixels, "pixels", _PIXELS.name),
            (self.wall_s + wall_s, lim.max_wall_s, "seconds of encoding", _ENCODE.name),
        ):
            if spent > bound:
                return f"cannot watermark: the job's video passes {_num(bound)} {what} ({env})"
        if self.deadline is not None and time.monotonic() > self.deadline:
            return f"cannot watermark: the encode ran past the finalize's media deadline ({Settings.media_deadline_s.name})"
        return None

    def spend(self, *, duration_s: float, frames: int, pixels: int, wall_s: float) -> None:
        self.duration_s += duration_s
        self.frames += frames
        self.pixels += pixels
        self.wall_s += wall_s


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"
