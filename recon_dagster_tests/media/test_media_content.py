"""Media a job promised is media. An empty object, an error page (HTML, XML, JSON,
plain text, whatever its Content-Type says) where an image, video or audio was promised, or a
media body with a Content-Encoding although identity was asked for, is an unusable result: the
attempt is counted, nothing is stored, completed or charged. Served from a loopback HTTP server
and reconciled through the real Reconciler and PostgreSQL."""

from __future__ import annotations

import gzip
import io
import zlib
from decimal import Decimal

import pytest
from PIL import Image

from recon_dagster.media.content import check_headers, promised_kind, sniff_problem
from recon_dagster.reconcile.decide import Outcome
from recon_dagster.sandbox.media import sample_video
from recon_dagster_tests.support.factories import balances, job_row
from recon_dagster_tests.support.reconcile import count, usage_status
from recon_dagster_tests.support.served_media import (
    reconcile_served,
    served_fixture,  # noqa: F401 (the fixture)
    stored_files,
)

# (kind, job type, promised media, Content-Type of the real thing, file name)
PROMISES = {
    "image": ("kie-standard", "image", "image/png", "0.png"),
    "video": ("kie-veo", "video", "video/mp4", "0.mp4"),
    "audio": ("kie-suno", "audio", "audio/mpeg", "0.mp3"),
    "image-by-job-type": ("replicate-prediction", "image-flux", "image/webp", "output"),
    "video-by-job-type": ("replicate-prediction", "video-wan", "video/mp4", "output"),
}

HTML = b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head><body>upstream error</body></html>"
XML = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>Request has expired</Message></Error>"
)
JSON = b'{"error": {"code": 500, "message": "internal error, please retry"}}'
BODIES = {
    "empty": b"",
    "empty-chunked": b"",
    "html": HTML,
    "xml": XML,
    "json": JSON,
    "json-array": b'[{"error": "quota"}]',
    "text": b"Internal Server Error",
    "html-with-bom-and-blank-lines": b"\xef\xbb\xbf\r\n\r\n  <html><body>oops</body></html>",
    "utf16-html": "\ufeff<html><body>fehler</body></html>".encode("utf-16-le"),
    "latin1-html": "<html><body>Zugriff verweigert: Schlüssel abgelaufen</body></html>".encode("latin-1"),
    "cp1252-json": '{"error": "quota “exceeded”"}'.encode("cp1252"),
    "shift-jis-text": "エラーが発生しました".encode("shift_jis"),
    "long-html": b"<html><body>" + "Fehlerbeschreibung \u00e9\u00e8 ".encode() * 200 + b"</body></html>",
}
TEXT_TYPES = {
    "html": "text/html; charset=utf-8",
    "xml": "application/xml",
    "json": "application/json",
    "problem-json": "application/problem+json",
    "plain": "text/plain",
}


def _in_flight_with_an_attempt(db, user, job, media_dir) -> None:
    row = job_row(db, job)
    assert (row["status"], row["reconcile_attempts"]) == ("processing", 1)
    assert usage_status(db, job) == "reserved"
    assert balances(db, user) == (Decimal(80), Decimal(40))
    assert count(db, "assets", job) == 0
    assert stored_files(media_dir) == []


@pytest.mark.slow
@pytest.mark.parametrize("watermark", [False, True], ids=["clean-row", "watermark-row"])
@pytest.mark.parametrize("body", sorted(BODIES))
@pytest.mark.parametrize("promise", sorted(PROMISES))
def test_a_text_or_empty_body_under_a_media_content_type_is_unusable(
    db, served, media_dir, promise, body, watermark
):
    kind, job_type, media_type, name = PROMISES[promise]
    url = served.add(BODIES[body], media_type, name=name, chunked=body in ("empty-chunked", "long-html"))

    user, job, out = reconcile_served(db, served, media_dir, kind, job_type, url, should_watermark=watermark)

    assert out.outcome is Outcome.ERROR, out.detail
    assert "not completed, nothing charged" in out.detail
    _in_flight_with_an_attempt(db, user, job, media_dir)


@pytest.mark.parametrize("content_type", sorted(TEXT_TYPES))
@pytest.mark.parametrize("promise", sorted(PROMISES))
def test_an_error_page_served_as_text_is_unusable(db, served, media_dir, promise, content_type):
    """The reason says what came back (its type, its size, what it reads as)
    and what was promised, not only that nothing was stored."""
    kind, job_type, _, name = PROMISES[promise]
    body = HTML if "html" in content_type else JSON
    url = served.add(body, TEXT_TYPES[content_type], name=name)

    user, job, out = reconcile_served(db, served, media_dir, kind, job_type, url)

    assert out.outcome is Outcome.ERROR, out.detail
    shape = "an HTML page" if body is HTML else "a JSON document"
    promised = {"image": "an image", "video": "a video", "audio": "audio"}[promise.split("-")[0]]
    assert out.detail.startswith(
        f"unusable result: {TEXT_TYPES[content_type].split(';')[0]}, {len(body)} bytes, reads as {shape}: "
    ), out.detail
    assert f", where {promised} was promised (from http://" in out.detail
    assert ("502 Bad Gateway" if body is HTML else '"message": "internal error') in out.detail
    assert job_row(db, job)["reconcile_last_error"] == out.detail
    _in_flight_with_an_attempt(db, user, job, media_dir)


def _bomb(encoding: str) -> bytes:
    zeros = bytes(64 * 1024 * 1024)
    if encoding == "gzip":
        return gzip.compress(zeros, 9)
    return zlib.compress(zeros, 9)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "GZIP", "br"])
@pytest.mark.parametrize("promise", ["image", "video", "audio"])
def test_a_media_body_with_a_content_encoding_is_refused_never_stored_as_a_bomb(
    db, served, media_dir, promise, encoding
):
    kind, job_type, media_type, name = PROMISES[promise]
    body = _bomb(encoding.lower()) if encoding != "br" else b"\x1b\xff\xff" * 1000
    url = served.add(body, media_type, name=name, headers={"Content-Encoding": encoding})

    user, job, out = reconcile_served(db, served, media_dir, kind, job_type, url, should_watermark=False)

    assert out.outcome is Outcome.ERROR, out.detail
    assert "Content-Encoding" in out.detail
    _in_flight_with_an_attempt(db, user, job, media_dir)


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 10, 10)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("promise", sorted(PROMISES))
def test_real_media_with_an_identity_encoding_still_completes(db, served, media_dir, promise):
    kind, job_type, media_type, name = PROMISES[promise]
    body = {
        "image": _png(),
        "video": sample_video("mp4"),
        "audio": b"ID3\x04\x00\x00\x00\x00\x00\x00" + bytes(range(256)) * 8,
    }[media_type.split("/")[0]]
    url = served.add(body, media_type, name=name, headers={"Content-Encoding": "identity"})

    _, job, out = reconcile_served(db, served, media_dir, kind, job_type, url)

    assert out.outcome is Outcome.RECOVERED, out.detail
    assert job_row(db, job)["status"] == "completed" and usage_status(db, job) == "committed"


# --- the pure rules ------------------------------------------------------------------------------


def _heads() -> dict[str, bytes]:
    out = {}
    for fmt in ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF"):
        buf = io.BytesIO()
        Image.new("RGB", (4, 4), (255, 255, 255)).save(buf, fmt)
        out[fmt] = buf.getvalue()
    out["mp4"] = sample_video("mp4")
    out["webm"] = sample_video("webm", audio=True)
    out["mp3-id3"] = b"ID3\x04\x00\x00\x00\x00\x00\x00"
    out["mp3-frame"] = b"\xff\xfb\x90\x64" + bytes(100)
    out["wav"] = b"RIFF\x24\x08\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00"
    out["ogg"] = b"OggS\x00\x02" + bytes(20)
    out["flac"] = b"fLaC\x00\x00\x00\x22"
    return out


@pytest.mark.parametrize("name", sorted(_heads()))
@pytest.mark.parametrize("promised", ["image", "video", "audio"])
def test_binary_media_is_never_taken_for_text(name, promised):
    assert sniff_problem(_heads()[name][:1024], promised) is None


def test_an_svg_image_is_an_image_but_xml_is_not():
    svg = b'<?xml version="1.0"?>\n<!-- made by a model -->\n<svg xmlns="http://www.w3.org/2000/svg"/>'
    assert sniff_problem(svg, "image") is None
    assert sniff_problem(svg, "video") is not None
    assert check_headers("image/svg+xml", None, None, "image") is None
    assert "XML" in (sniff_problem(XML, "image") or "")


def test_nothing_promised_means_no_sniffing_but_empty_and_encoded_are_still_refused():
    assert promised_kind("file", "files") is None
    assert promised_kind("file", "videos") == "video"
    assert promised_kind("audio", "images") == "audio"
    assert sniff_problem(JSON, None) is None
    assert check_headers("application/json", None, None, None) is None
    assert "empty" in (check_headers("application/x-tar", None, 0, None) or "")
    assert "Content-Encoding" in (check_headers("application/x-tar", "gzip", 10, None) or "")
