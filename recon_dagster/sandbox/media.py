"""Media objects the sandbox serves: a real PNG, a real MP4 padded to the requested size, or
deterministic bytes generated chunk by chunk."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from functools import cache
from typing import cast

CHUNK_SIZE = 64 * 1024

# media kind -> (file extension, content type)
MEDIA_TYPES: dict[str, tuple[str, str]] = {
    "image": ("png", "image/png"),
    "video": ("mp4", "video/mp4"),
    "audio": ("mp3", "audio/mpeg"),
    "weights": ("tar", "application/x-tar"),
    "text": ("txt", "text/plain; charset=utf-8"),
}

# Leading bytes that make content sniffers see the right type (video: a real MP4 leads instead).
_MAGIC: dict[str, bytes] = {
    "audio": b"ID3\x04\x00\x00\x00\x00\x00\x00",
    "weights": b"sandbox-weights\x00",
    "text": b"",
}


@cache
def png_bytes() -> bytes:
    """A real, small PNG (made once with Pillow)."""
    from PIL import Image

    img = Image.new("RGB", (64, 64))
    img.putdata([(x * 4, y * 4, 128) for y in range(64) for x in range(64)])
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@cache
def _block() -> bytes:
    # One fixed pseudo-random block, repeated: cheap to serve at any size, never all in memory.
    return hashlib.shake_256(b"recon-dagster-sandbox-media").digest(CHUNK_SIZE)


def sample_video(
    fmt: str = "mp4",
    *,
    frames: int = 12,
    size: tuple[int, int] = (64, 48),
    fps: int = 12,
    audio: bool = False,
    color: tuple[int, int, int] = (40, 120, 200),
) -> bytes:
    """A real, small video made with PyAV: ``mp4`` (H.264, AAC audio) or ``webm`` (VP9, Opus
    audio); each frame a flat colour that shifts a little from frame to frame."""
    import math
    import struct
    from fractions import Fraction

    import av
    from av.audio.stream import AudioStream
    from av.video.stream import VideoStream
    from PIL import Image

    video_codec, audio_codec = ("libx264", "aac") if fmt == "mp4" else ("libvpx-vp9", "libopus")
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        video = cast("VideoStream", out.add_stream(video_codec, rate=fps))
        video.width, video.height, video.pix_fmt = size[0], size[1], "yuv420p"
        sound = cast("AudioStream", out.add_stream(audio_codec, rate=48000)) if audio else None
        if sound is not None:
            sound.layout = "mono"
        for i in range(frames):
            shade = tuple(min(255, c + 3 * i) for c in color)
            frame = av.VideoFrame.from_image(Image.new("RGB", size, shade)).reformat(format="yuv420p")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
        if sound is not None:
            samples, step = 48000 * frames // fps, 960
            for start in range(0, samples, step):
                tone = av.AudioFrame(format="s16", layout="mono", samples=step)
                tone.planes[0].update(
                    b"".join(
                        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * (start + k) / 48000)))
                        for k in range(step)
                    )
                )
                tone.sample_rate, tone.pts, tone.time_base = 48000, start, Fraction(1, 48000)
                out.mux(sound.encode(tone))
            out.mux(sound.encode(None))
    return buf.getvalue()


@cache
def _video_head() -> bytes:
    return sample_video("mp4")


def media_length(kind: str, size: int) -> int:
    """How many bytes ``iter_media`` yields for this kind and requested size."""
    if kind == "image":
        return len(png_bytes())
    if kind == "video":
        return max(size, len(_video_head()))
    return size


def iter_media(task_id: str, n: int, kind: str, size: int) -> Iterator[bytes]:
    """The bytes of media object ``n`` of a task, in chunks of at most ``CHUNK_SIZE``.

    Deterministic: the same arguments always give the same bytes (see ``media_digest``).
    """
    if kind == "image":
        yield png_bytes()
        return
    head = _MAGIC.get(kind, b"") + f"{task_id}/{n}\n".encode()
    if kind == "video":
        # A real MP4 (so a watermark can decode it), then a ``free`` box padding it to ``size``:
        # MP4 readers skip free boxes, so every size stays a valid video.
        video = _video_head()
        yield video
        size -= len(video)
        if size < 8:  # no room for a box header: the few bytes asked for, as zeros
            if size > 0:
                yield bytes(size)
            return
        head = _free_box_header(size) + head
    block = _block()
    first = (head + block)[:CHUNK_SIZE]
    remaining = size
    if remaining <= 0:
        return
    chunk = first[:remaining]
    yield chunk
    remaining -= len(chunk)
    while remaining > 0:
        chunk = block[: min(CHUNK_SIZE, remaining)]
        yield chunk
        remaining -= len(chunk)


def _free_box_header(size: int) -> bytes:
    """The header of an MP4 ``free`` box of ``size`` bytes in all (64-bit size past 4 GiB)."""
    if size < 1 << 32:
        return size.to_bytes(4, "big") + b"free"
    return (1).to_bytes(4, "big") + b"free" + size.to_bytes(8, "big")


def media_digest(task_id: str, n: int, kind: str, size: int) -> str:
    """SHA-256 hex of what the sandbox serves for this media object (computed by streaming)."""
    h = hashlib.sha256()
    for chunk in iter_media(task_id, n, kind, size):
        h.update(chunk)
    return h.hexdigest()
