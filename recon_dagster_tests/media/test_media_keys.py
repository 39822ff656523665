"""Media keys: deterministic per job and per provider task, unsafe parts refused."""

from __future__ import annotations

import uuid

import pytest

from recon_dagster.media.store import (
    guess_ext,
    media_key,
    validate_key,
)

MIB = 1024 * 1024
BUCKET = "recon-media-test"


def test_media_key_is_deterministic_per_job() -> None:
    job = uuid.UUID("5f0c2c2e-8d0b-4c8e-9a59-0f4e3a7c1d10")
    assert media_key(job, "image-ai", 0, "png") == f"images/{job}/0.png"
    assert media_key(job, "image-ai", 0, ".PNG", variant="watermarked") == f"images/{job}/0.watermarked.png"
    assert media_key(job, "video-ai", 1, "mp4") == f"videos/{job}/1.mp4"
    assert media_key(job, "kie-lip-sync", 0, "mp4") == f"videos/{job}/0.mp4"
    assert media_key(job, "suno", 0, "mp3") == f"audio/{job}/0.mp3"
    assert media_key(job, "elevenlabs-tts", 0, "mp3") == f"audio/{job}/0.mp3"
    assert media_key(job, "character-lora-training", 0, "tar") == f"loras/{job}/0.tar"
    assert media_key(job, "weights", 0, "safetensors") == f"loras/{job}/0.safetensors"
    assert media_key(job, "ai-writer", 0, "json") == f"files/{job}/0.json"
    assert media_key(job, "image-ai", 0, "png") == media_key(str(job), "image-ai", 0, "png")


@pytest.mark.parametrize(
    "task", ["task-1", "a/../b", "ü ø\n", "x" * 500, "550e8400-e29b-41d4-a716-446655440000"]
)
def test_media_keys_are_deterministic_per_task_and_distinct_across_tasks(task: str) -> None:
    job = uuid.UUID("5f0c2c2e-8d0b-4c8e-9a59-0f4e3a7c1d10")
    key = media_key(job, "video-ai", 0, "mp4", task=task)
    assert key == media_key(str(job), "video-ai", 0, "mp4", task=task)  # a retry rewrites one object
    assert validate_key(key) == key and key.startswith(f"videos/{job}/") and key.endswith("/0.mp4")
    others = {media_key(job, "video-ai", 0, "mp4", task=t) for t in (task + "x", task.upper() + "!")}
    assert key not in others and key != media_key(job, "video-ai", 0, "mp4")
    marked = media_key(job, "image", 0, "png", variant="watermarked", task=task)
    assert ".watermarked." in marked and marked.rsplit("/", 2)[1] == key.rsplit("/", 2)[1]
    with pytest.raises(ValueError):
        media_key(job, "image", 0, "png", task="")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"job_id": "../etc", "job_type": "image"},
        {"job_id": "a/b", "job_type": "image"},
        {"job_id": "", "job_type": "image"},
        {"job_id": "j1", "job_type": "image", "ext": "p/ng"},
        {"job_id": "j1", "job_type": "image", "index": -1},
        {"job_id": "j1", "job_type": "image", "variant": "Water Marked"},
    ],
)
def test_media_key_rejects_unsafe_parts(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        media_key(**kwargs)  # type: ignore[arg-type]


def test_guess_ext() -> None:
    assert guess_ext("image/png") == "png"
    assert guess_ext("image/jpeg; charset=binary") == "jpg"
    assert guess_ext("video/mp4") == "mp4"
    assert guess_ext("audio/mpeg") == "mp3"
    assert guess_ext("application/octet-stream", "https://x.example/out/a.webp?sig=1") == "webp"
    assert guess_ext(None, "https://x.example/out/noext") == "bin"
