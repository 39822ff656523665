"""A download killed mid-write leaves a ``.part`` file; the next write in that folder (or a tree
sweep) removes it, and never a part a live writer is still filling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from recon_dagster.media.folder import FolderWriter, part_is_stale

pytestmark = pytest.mark.timeout(60)

KEY = "videos/job-1/0.mp4"

# A writer that streams into the store forever, announcing its first chunk on stdout.
_WRITER = textwrap.dedent(
    """
    import sys, time
    from recon_dagster.media.folder import FolderWriter

    def chunks():
        yield b"x" * 65536
        print("writing", flush=True)
        while True:
            time.sleep(0.05)
            yield b"y" * 65536

    FolderWriter(sys.argv[1]).put_stream(sys.argv[2], chunks(), "video/mp4")
    """
)


def _start_writer(base: Path, key: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(base), key], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "writing"
    return proc


def _parts(base: Path) -> list[Path]:
    return sorted(p for p in base.rglob("*.part"))


def _sigkill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def test_the_next_write_in_the_folder_removes_the_part_of_a_killed_writer(tmp_path):
    for _ in range(3):
        _sigkill(_start_writer(tmp_path, KEY))
        # Each new writer cleared the part of the one killed before it: they never pile up.
        assert len(_parts(tmp_path)) == 1

    stored = FolderWriter(tmp_path).put_stream(KEY, iter([b"complete"]), "video/mp4")

    assert _parts(tmp_path) == []
    assert (tmp_path / KEY).read_bytes() == b"complete" and stored.size == 8


def test_a_live_writers_part_is_left_alone_until_it_is_older_than_the_lease(tmp_path, monkeypatch):
    live = _start_writer(tmp_path, KEY)
    try:
        FolderWriter(tmp_path).put_stream("videos/job-1/1.mp4", iter([b"other"]), "video/mp4")
        (part,) = _parts(tmp_path)  # the live writer's part survived the neighbour's write

        monkeypatch.setenv("RECON_LEASE_S", "60")
        old = time.time() - 61
        os.utime(part, (old, old))
        FolderWriter(tmp_path).put_stream("videos/job-1/1.mp4", iter([b"other"]), "video/mp4")
        assert _parts(tmp_path) == []  # older than the lease: no live download runs that long
    finally:
        _sigkill(live)


def test_a_tree_sweep_removes_dead_parts_everywhere(tmp_path):
    for key in ("videos/a/0.mp4", "images/b/0.png", "audio/c/0.mp3"):  # one part per folder
        _sigkill(_start_writer(tmp_path, key))
    assert len(_parts(tmp_path)) == 3

    assert FolderWriter(tmp_path).sweep_stale_parts() == 3
    assert _parts(tmp_path) == []


def test_the_staleness_rule():
    host, me = "box-1", os.getpid()
    dead = 2**22 + 12345  # above the default pid_max: no such process
    assert part_is_stale(f".0.mp4.w{dead}-{host}.abc.part", 5, 900, host, me)
    assert not part_is_stale(f".0.mp4.w{me}-{host}.abc.part", 5, 900, host, me)  # ours, maybe in progress
    assert not part_is_stale(f".0.mp4.w{dead}-other.abc.part", 5, 900, host, me)  # another host's writer
    assert not part_is_stale(".0.mp4.legacy123.part", 5, 900, host, me)  # unknown writer: by age only
    assert part_is_stale(".0.mp4.legacy123.part", 901, 900, host, me)
    assert part_is_stale(f".0.mp4.w{me}-{host}.abc.part", 901, 900, host, me)
