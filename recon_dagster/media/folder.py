"""``FolderWriter``: a ``MediaStore`` in a local folder, with no Dagster import.

Writes go to a temp file next to the target, are fsynced, then renamed over it, so a reader sees
either the old object or the whole new one, and a failing chunk iterator leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from recon_dagster.media.base import StoredObject, validate_key


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
        digest = hashlib.sha256()
        size = 0
        # Same directory as the target, so os.replace is an atomic rename on one filesystem.
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
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
