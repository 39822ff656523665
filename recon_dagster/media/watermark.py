"""Visible watermark for images of jobs whose row says ``should_watermark`` (spec section 7).

A semi-transparent dark band across the lower part of the image with the text centred on it.
PNG, JPEG and WebP keep their format; other still formats (GIF, BMP, TIFF...) come back as PNG.
EXIF orientation is applied first so the band sits at the bottom of the image as people see it.
"""

from __future__ import annotations

import io

from PIL import Image, ImageDraw, ImageFont, ImageOps, UnidentifiedImageError

from recon_dagster.media.errors import MediaNotImage

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
    base = image.convert("RGBA")
    marked = Image.alpha_composite(base, _overlay(base.size, text))

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


def _overlay(size: tuple[int, int], text: str) -> Image.Image:
    width, height = size
    overlay = Image.new("RGBA", size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(overlay)
    band_height = max(1, height // 6)
    top = height - band_height - max(0, height // 20)
    draw.rectangle([(0, top), (width, top + band_height)], fill=(0, 0, 0, _BAND_ALPHA))
    if text:
        font_size = max(8, int(band_height * 0.6))
        font = ImageFont.load_default(size=font_size)
        left, upper, right, lower = draw.textbbox((0, 0), text, font=font)
        # Shrink long text until it fits the width with a margin.
        while right - left > width * 0.9 and font_size > 8:
            font_size = max(8, int(font_size * 0.8))
            font = ImageFont.load_default(size=font_size)
            left, upper, right, lower = draw.textbbox((0, 0), text, font=font)
        x = (width - (right - left)) / 2 - left
        y = top + (band_height - (lower - upper)) / 2 - upper
        draw.text((x, y), text, font=font, fill=(255, 255, 255, _TEXT_ALPHA))
    return overlay
