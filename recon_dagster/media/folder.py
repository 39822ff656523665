"""``FolderWriter``: a ``MediaStore`` in a local folder, with no Dagster import.

Writes go to a temp file next to the target, are fsynced, then renamed over it, so a reader sees
either the old object or the whole new one, and a failing chunk iterator leaves nothing behind.

A writer killed mid-write (SIGKILL, OOM) cannot remove its temp file, so each ``.part`` name
carries its writer (``.<name>.w<pid>-<host>.<random>.part``) and every write first clears the
stale parts of its folder: those whose writer process is gone (same host), and any older than the
reconcile lease (``RECON_LEASE_S``: no live download runs that long). ``sweep_stale_parts()``
does the same for the whole tree.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from recon_dagster.core.deadlines import stale_part_age_s
from recon_dagster.media.base import StoredObject, validate_key

log = logging.getLogger("recon_dagster.media.folder")

_PART = re.compile(r"\.w(?P<pid>\d+)-(?P<host>[A-Za-z0-9-]*)\.[^.]+\.part$")


def _host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:63]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def part_is_stale(name: str, age_s: float, max_age_s: float, host: str, own_pid: int) -> bool:
    """Whether a temp file left in a media folder may be removed (pure but for the pid probe).

    Older than ``max_age_s``: always. Younger: only when it names a writer on this host whose
    process is gone (this process's own parts may be in progress on another thread)."""
    if age_s > max_age_s:
        return True
    match = _PART.search(name)
    if match is None or match["host"] != host:
        return False
    pid = int(match["pid"])
    return pid != own_pid and not _pid_alive(pid)


class FolderWriter:
    """Media under ``base_dir`` (a relative folder is taken against the cwd at each call)."""

    def __init__(self, base_dir: str | os.PathLike[str]) -> None:
        if not str(base_dir):
            raise ValueError("FolderWriter needs a base_dir (the folder that holds the media tree)")
        self.base_dir = str(base_dir)

    def __repr__(self) -> str:
        return f"FolderWriter(base_dir={self.base_dir!r})"

    def path(self, key: str) -> Path:
        """Absolute path of ``key``; ``ValueError`` for a key that could leave the folder."""
        return Path(self.base_dir).absolute() / validate_key(key)

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> StoredObject:
        """Write ``chunks`` to ``key``; a failing iterator leaves nothing behind (and any old object intact)."""
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._clear_stale_parts(path.parent)
        digest = hashlib.sha256()
        size = 0
        # Same directory as the target, so os.replace is an atomic rename on one filesystem.
        fd, tmp_name = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.w{os.getpid()}-{_host_tag()}.", suffix=".part"
        )
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp_name, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise
        return StoredObject(key=key, size=size, url=path.as_uri(), sha256=digest.hexdigest())

    def _clear_stale_parts(self, folder: Path) -> int:
        """Remove the stale ``.part`` files directly in ``folder``; returns how many."""
        removed = 0
        now, host, pid, max_age = time.time(), _host_tag(), os.getpid(), stale_part_age_s()
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return 0
        for entry in entries:
            if not (entry.name.startswith(".") and entry.name.endswith(".part")):
                continue
            try:
                age = now - entry.stat(follow_symlinks=False).st_mtime
                if entry.is_file(follow_symlinks=False) and part_is_stale(
                    entry.name, age, max_age, host, pid
                ):
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:  # its writer finished (renamed it) or another sweep took it
                continue
        if removed:
            log.info("removed %d stale partial write(s) in %s", removed, folder)
        return removed

    def sweep_stale_parts(self) -> int:
        """Remove every stale ``.part`` file under the store (for an operator or a schedule)."""
        base = Path(self.base_dir).absolute()
        if not base.is_dir():
            return 0
        return sum(self._clear_stale_parts(Path(d)) for d, _, _ in os.walk(base))

    def exists(self, key: str) -> bool:
        """True when an object is stored at ``key``."""
        return self.path(key).is_file()

    def read_bytes(self, key: str) -> bytes:
        """The whole object (meant for tests and small objects); ``FileNotFoundError`` if absent."""
        return self.path(key).read_bytes()

    def delete(self, key: str) -> None:
        """Remove the object at ``key``; absent is fine."""
        with contextlib.suppress(FileNotFoundError):
            self.path(key).unlink()
