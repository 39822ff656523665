"""The image watermark: pixels change, format and size stay, non-images are refused."""

from __future__ import annotations

import io

import pytest

from recon_dagster.media.errors import MediaError, MediaNotImage
from recon_dagster.media.watermark import watermark_image

MIB = 1024 * 1024
BUCKET = "recon-media-test"


def _image_bytes(fmt: str, size: tuple[int, int] = (320, 240), mode: str = "RGB") -> bytes:
    from PIL import Image

    # A gradient, so a changed region cannot hide in a flat colour.
    image = Image.linear_gradient("L").resize(size).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("fmt", "mode", "content_type"),
    [
        ("PNG", "RGB", "image/png"),
        ("PNG", "RGBA", "image/png"),
        ("JPEG", "RGB", "image/jpeg"),
        ("WEBP", "RGB", "image/webp"),
    ],
)
def test_watermark_changes_pixels_and_keeps_format_and_size(fmt: str, mode: str, content_type: str) -> None:
    from PIL import Image, ImageChops

    original = _image_bytes(fmt, mode=mode)
    marked, marked_type = watermark_image(original, "recon")
    assert marked_type == content_type
    before, after = Image.open(io.BytesIO(original)), Image.open(io.BytesIO(marked))
    assert after.format == fmt
    assert after.size == before.size
    assert after.mode == before.mode
    diff = ImageChops.difference(before.convert("RGB"), after.convert("RGB")).convert("L")
    changed = sum(1 for value in diff.tobytes() if value > 16)
    # The band covers about a sixth of the image; compression noise alone stays far below.
    assert changed > before.size[0] * before.size[1] // 10
    # The top of the image, above the band, is untouched (up to JPEG noise).
    top = diff.crop((0, 0, before.size[0], before.size[1] // 2))
    assert max(top.tobytes()) <= 16


def test_watermark_text_is_visible_on_the_band() -> None:
    from PIL import Image

    plain, _ = watermark_image(_image_bytes("PNG"), "")
    texted, _ = watermark_image(_image_bytes("PNG"), "recon")
    a, b = Image.open(io.BytesIO(plain)).convert("L"), Image.open(io.BytesIO(texted)).convert("L")
    assert a.tobytes() != b.tobytes()


def test_other_formats_come_back_as_png() -> None:
    from PIL import Image

    marked, content_type = watermark_image(_image_bytes("BMP"))
    assert content_type == "image/png"
    assert Image.open(io.BytesIO(marked)).size == (320, 240)


@pytest.mark.parametrize(
    "data",
    [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40],
    ids=["empty", "text", "broken-png"],
)
def test_watermark_refuses_non_images(data: bytes) -> None:
    with pytest.raises(MediaNotImage, match="cannot watermark"):
        watermark_image(data)
    assert issubclass(MediaNotImage, MediaError)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        ((320, 240), "recon"),
        ((1920, 1080), "a watermark text long enough to be shrunk to fit the width"),
        ((50, 7), "recon"),  # text taller than the band, its origin above the band
        ((3, 3), "a long text on a tiny picture"),
        ((1, 1), "recon"),
        ((640, 61), ""),
    ],
)
def test_watermark_only_composites_the_rows_the_overlay_draws_on(size: tuple[int, int], text: str) -> None:
    """The watermark composites only the rows its overlay draws on (the band and any text that
    overflows it); the pixels are those of compositing a whole-picture overlay, tiny pictures
    included (their text is not clipped to the band) (a full-size overlay per image)."""
    from PIL import Image

    from recon_dagster.media.watermark import _overlay_rows

    original = _image_bytes("PNG", size=size)
    marked, _ = watermark_image(original, text)
    base = Image.open(io.BytesIO(original)).convert("RGBA")
    expected = Image.alpha_composite(base, _overlay_rows(size, text, 0, size[1])).convert("RGB")
    assert Image.open(io.BytesIO(marked)).convert("RGB").tobytes() == expected.tobytes()
