"""Visible watermark for images and videos of jobs whose row says ``should_watermark`` (spec
section 7); audio is stored as it came.

A semi-transparent dark band across the lower part of the picture with the text centred on it.
PNG, JPEG and WebP keep their format; other still formats (GIF, BMP, TIFF...) come back as PNG.
EXIF orientation is applied first so the band sits at the bottom of the image as people see it.

Video (PyAV, whose wheels ship FFmpeg) is read from a file and written to a file, frame by frame:
memory holds a few frames and the codecs' buffers, never the video. Every frame of the first video
stream gets the band; the audio is copied packet for packet; other streams (a second video track, a
cover picture, subtitles) are dropped, so no clean picture survives. Every video comes back as
MP4 (H.264, which every player reads), or as Matroska when its audio cannot go into MP4: a WebM
too, since libvpx's VP9 encoder peaked at 165 MB on 720p where x264 stays under 100 MB.
"""

from __future__ import annotations

import io
import math
import time
from fractions import Fraction
from functools import cache, lru_cache
from typing import TYPE_CHECKING

from PIL import Image, ImageDraw, ImageFont, ImageOps, UnidentifiedImageError

from recon_dagster.media.errors import MediaNotImage, MediaNotVideo
from recon_dagster.media.video_limits import VideoBudget

if TYPE_CHECKING:
    from av.audio.stream import AudioStream
    from av.container import InputContainer, OutputContainer
    from av.video.frame import VideoFrame
    from av.video.stream import VideoStream

# Refuse decompression bombs with a clear error (Pillow's own limit only warns below 2x).
MAX_PIXELS = 80_000_000
_KEEP = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
_BAND_ALPHA = 110  # of 255: the image stays readable under the band
_TEXT_ALPHA = 200


def watermark_image(data: bytes, text: str = "recon") -> tuple[bytes, str]:
    """Return ``(watermarked bytes, content type)``; ``MediaNotImage`` if ``data`` is not an image."""
    image = _open(data)
    source_format = image.format or ""
    image = ImageOps.exif_transpose(image)
    has_alpha = image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)
    marked = image.convert("RGBA")
    # Only the rows the overlay draws on change: composite there (the same pixels as compositing
    # an overlay the size of the picture, transparent elsewhere, without allocating one).
    first, end = _image_rows(marked.size, text)
    box = (0, first, marked.width, end)
    marked.paste(
        Image.alpha_composite(marked.crop(box), _overlay_for(marked.size, text, first, end)), box[:2]
    )

    out_format = source_format if source_format in _KEEP else "PNG"
    buffer = io.BytesIO()
    if out_format == "JPEG":
        marked.convert("RGB").save(buffer, "JPEG", quality=92, optimize=True)
    elif out_format == "WEBP":
        (marked if has_alpha else marked.convert("RGB")).save(buffer, "WEBP", quality=92)
    else:
        (marked if has_alpha else marked.convert("RGB")).save(buffer, "PNG", optimize=False)
    return buffer.getvalue(), _KEEP[out_format]


def _open(data: bytes) -> Image.Image:
    if not data:
        raise MediaNotImage(None, "cannot watermark: empty input")
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > MAX_PIXELS:
            raise MediaNotImage(None, f"cannot watermark: {width}x{height} exceeds {MAX_PIXELS} pixels")
        image.load()
    except MediaNotImage:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, SyntaxError) as exc:
        raise MediaNotImage(
            None, f"cannot watermark: input is not a readable image ({type(exc).__name__})"
        ) from None
    return image


def _band_box(size: tuple[int, int]) -> tuple[int, int, int, int]:
    """The band: a sixth of the height, lifted a twentieth of it off the bottom edge."""
    width, height = size
    band_height = max(1, height // 6)
    top = max(0, height - band_height - height // 20)
    return 0, top, width, top + band_height


@lru_cache(maxsize=64)
def _text_layout(size: tuple[int, int], text: str) -> tuple[int, float, float, int, int]:
    """Where the text goes: (font size, x, y, first row, end row) in picture coordinates; the
    font shrinks until the text fits the width with a margin. Kept per size and text: an image
    asks for it twice (the rows to composite, then the overlay), and a backlog repeats a few
    sizes. Numbers only: a FreeType font object is not shared between threads."""
    width, _ = size
    _, top, _, bottom = _band_box(size)
    band_height = bottom - top
    measure = ImageDraw.Draw(Image.new("RGBA", (1, 1)))
    font_size = max(8, int(band_height * 0.6))
    font = ImageFont.load_default(size=font_size)
    left, upper, right, lower = measure.textbbox((0, 0), text, font=font)
    while right - left > width * 0.9 and font_size > 8:
        font_size = max(8, int(font_size * 0.8))
        font = ImageFont.load_default(size=font_size)
        left, upper, right, lower = measure.textbbox((0, 0), text, font=font)
    x = (width - (right - left)) / 2 - left
    y = top + (band_height - (lower - upper)) / 2 - upper
    return font_size, x, y, math.floor(y + upper), math.floor(y + lower) + 1


def _overlay_rows(size: tuple[int, int], text: str, first: int, end: int) -> Image.Image:
    """Rows ``first`` to ``end`` (exclusive) of the overlay: transparent but for the dark band
    and the text on it. Drawn at the offset of those rows, so the pixels equal the same rows of an
    overlay the size of the whole picture, without allocating one."""
    width, _ = size
    _, top, _, bottom = _band_box(size)
    overlay = Image.new("RGBA", (width, end - first), (0, 0, 0, 0))
    draw = ImageDraw.Draw(overlay)
    draw.rectangle([(0, top - first), (width, bottom - first)], fill=(0, 0, 0, _BAND_ALPHA))
    if text:
        font_size, x, y, _, _ = _text_layout(size, text)
        font = ImageFont.load_default(size=font_size)
        draw.text((x, y - first), text, font=font, fill=(255, 255, 255, _TEXT_ALPHA))
    return overlay


def _image_rows(size: tuple[int, int], text: str) -> tuple[int, int]:
    """The rows an image's overlay covers: the band (its rectangle includes its bottom row) and
    the text, which on a picture a few rows high is taller than the band; two rows of margin for
    anti-aliasing. They start at or above the text's origin row, so the text is drawn at the same
    sub-pixel offset as on a whole-picture overlay (a negative origin would round the other way)."""
    _, height = size
    _, top, _, bottom = _band_box(size)
    first, end = top, bottom + 1
    if text:
        _, _, y, text_first, text_end = _text_layout(size, text)
        first, end = min(first, text_first, math.floor(max(y, 0))), max(end, text_end)
    return max(0, first - 2), min(height, end + 2)


# Overlays of pictures up to about 1080p are kept (a backlog repeats a few sizes, and drawing the
# text was most of an image's watermark cost); larger ones are drawn each time, so the cache
# stays small (at most 8 x 2 MB). Cached overlays are shared: callers only read them.
_CACHED_OVERLAY_PIXELS = 500_000


@lru_cache(maxsize=8)
def _cached_overlay_rows(size: tuple[int, int], text: str, first: int, end: int) -> Image.Image:
    return _overlay_rows(size, text, first, end)


def _overlay_for(size: tuple[int, int], text: str, first: int, end: int) -> Image.Image:
    if size[0] * (end - first) <= _CACHED_OVERLAY_PIXELS:
        return _cached_overlay_rows(size, text, first, end)
    return _overlay_rows(size, text, first, end)


def _band(size: tuple[int, int], text: str) -> tuple[tuple[int, int, int, int], Image.Image]:
    """A video's band: the rectangle it covers and the overlay's rows there (the text is clipped
    to the band)."""
    box = _band_box(size)
    return box, _overlay_for(size, text, box[1], box[3])


# --- video ---------------------------------------------------------------------------------------

# 8K UHD: a larger frame is refused (a frame is held as RGB while its band is drawn).
MAX_VIDEO_PIXELS = 7680 * 4320
_CONTENT_TYPES = {"mp4": "video/mp4", "matroska": "video/x-matroska"}
# A fast preset and two threads: re-encoding must not hold many frames (memory) or take long.
# Measured on 720p noise (benchmarks/video_watermark_memory.py): veryfast peaks at 145 MB,
# superfast without lookahead 120 MB, ultrafast 88 MB and 2.5x faster (files ~1.4x larger).
_X264_OPTIONS = {"preset": "ultrafast", "crf": "20", "threads": "2"}


def watermark_video(
    src_path: str, dst_path: str, text: str = "recon", budget: VideoBudget | None = None
) -> str:
    """Re-encode the video at ``src_path`` into ``dst_path`` with the band drawn into every frame,
    within what ``budget`` (the job's; default: ``RECON_VIDEO_*``) has left.

    Returns the content type written (``video/mp4``, or ``video/x-matroska``); raises ``MediaNotVideo``
    when the input is no readable video (corrupt, no video stream, no decodable frame, an
    unsupported codec) or when it passes the budget's duration, frames, pixels or wall time
    (checked against what the container declares first, then as it is decoded). ``dst_path`` is
    then incomplete and must be discarded by the caller.
    """
    import av  # loaded on first video: the download path does not pay for FFmpeg

    budget = budget or VideoBudget()
    try:
        with av.open(src_path, "r") as source:
            if not source.streams.video:
                raise MediaNotVideo(None, "cannot watermark: no video stream")
            video = source.streams.video[0]
            audio = source.streams.audio[0] if source.streams.audio else None
            _check_declared(source, video, budget)
            out_format = _container_for(audio)
            with av.open(dst_path, "w", format=out_format) as target:
                frames = _reencode(source, video, audio, target, text, budget)
            if frames == 0:
                raise MediaNotVideo(None, "cannot watermark: no decodable video frame")
    except MediaNotVideo:
        raise
    except (av.FFmpegError, OSError, ValueError, TypeError, EOFError) as exc:
        raise MediaNotVideo(
            None, f"cannot watermark: input is not a readable video ({type(exc).__name__}: {exc})"[:500]
        ) from None
    return _CONTENT_TYPES[out_format]


@cache
def _mp4_codecs() -> frozenset[str]:
    import av

    with av.open(io.BytesIO(), "w", format="mp4") as probe:
        return frozenset(probe.supported_codecs)


def _container_for(audio: AudioStream | None) -> str:
    """MP4, unless the audio to copy cannot go into MP4: then Matroska, which takes any codec."""
    if audio is None or audio.codec_context.codec.canonical_name in _mp4_codecs():
        return "mp4"
    return "matroska"


def _check_declared(source: InputContainer, video: VideoStream, budget: VideoBudget) -> None:
    """Refuse before decoding a video whose container already declares more than the budget."""
    declared_s = (source.duration or 0) / 1_000_000  # av.time_base: microseconds
    if video.duration and video.time_base:
        declared_s = max(declared_s, float(video.duration * video.time_base))
    frames = max(0, video.frames or 0)
    problem = budget.refusal(
        duration_s=declared_s, frames=frames, pixels=frames * (video.width or 0) * (video.height or 0)
    )
    if problem is not None:
        raise MediaNotVideo(None, f"{problem}; declared by the container")


def _reencode(
    source: InputContainer,
    video: VideoStream,
    audio: AudioStream | None,
    target: OutputContainer,
    text: str,
    budget: VideoBudget,
) -> int:
    """Demux ``source``: video frames get the band and go through x264, audio packets are
    copied. Returns the number of video frames written; spends them (and the video's duration,
    pixels and wall time) from ``budget``, refusing (``MediaNotVideo``) once any runs out."""
    width, height = video.width, video.height
    if not width or not height or width * height > MAX_VIDEO_PIXELS:
        raise MediaNotVideo(None, f"cannot watermark: video size {width}x{height} is not supported")
    # 4:2:0 needs even sizes: a last odd row or column is dropped.
    width, height = width - width % 2, height - height % 2
    rate = video.average_rate or video.guessed_rate or Fraction(25)
    time_base = video.time_base or 1 / Fraction(rate)
    out_video = target.add_stream("libx264", rate=rate, options=_X264_OPTIONS)
    out_video.width, out_video.height, out_video.pix_fmt = width, height, "yuv420p"
    out_video.time_base = out_video.codec_context.time_base = time_base
    out_audio = target.add_stream_from_template(audio) if audio is not None else None
    mark = _FrameMarker(*_band((width, height), text), (width, height))
    step = max(1, round(1 / (rate * time_base)))  # one frame in time_base units, for frames without pts
    frames, pts = 0, -step
    started, first, last = time.monotonic(), None, 0.0  # stream times seen (seconds), any stream
    per_frame = width * height

    def check() -> None:
        problem = budget.refusal(
            duration_s=last - (first or 0.0), frames=frames, pixels=frames * per_frame,
            wall_s=time.monotonic() - started,
        )  # fmt: skip
        if problem is not None:
            raise MediaNotVideo(None, problem)

    for packet in source.demux(*(s for s in (video, audio) if s is not None)):
        if packet.pts is not None and packet.time_base is not None:
            at = float(packet.pts * packet.time_base)
            first, last = (at if first is None else min(first, at)), max(last, at)
        if packet.stream is not video:
            if packet.dts is not None and out_audio is not None:  # a flush packet carries nothing
                packet.stream = out_audio
                target.mux(packet)
            check()  # a long audio track beside a short video is a long video too
            continue
        for frame in video.decode(packet):
            pts = frame.pts if frame.pts is not None else pts + step
            marked = mark(frame)
            marked.pts, marked.time_base = pts, time_base
            target.mux(out_video.encode(marked))
            frames += 1
            check()
    target.mux(out_video.encode(None))
    check()
    budget.spend(
        duration_s=last - (first or 0.0),
        frames=frames,
        pixels=frames * per_frame,
        wall_s=time.monotonic() - started,
    )
    return frames


class _FrameMarker:
    """Draws the band into each frame of one video: decoded frame -> RGB, band composited into
    its rectangle, -> yuv420p for x264. The two pixel-format converters are kept for the whole
    video (a converter made per frame, as ``VideoFrame.reformat`` does, cost more than the
    conversion itself on small frames)."""

    def __init__(self, box: tuple[int, int, int, int], band: Image.Image, size: tuple[int, int]) -> None:
        from av.video.reformatter import VideoReformatter

        self.box, self.band, self.size = box, band, size
        self._to_rgb = VideoReformatter()
        self._to_yuv = VideoReformatter()

    def __call__(self, frame: VideoFrame) -> VideoFrame:
        from av import VideoFrame

        image = self._to_rgb.reformat(frame, format="rgb24").to_image()
        if image.size != self.size:  # an odd size evened, or a size change mid-stream
            image = image.resize(self.size)
        region = image.crop(self.box).convert("RGBA")
        image.paste(Image.alpha_composite(region, self.band).convert("RGB"), self.box[:2])
        return self._to_yuv.reformat(VideoFrame.from_image(image), format="yuv420p")
