"""Where this package runs from: the source checkout (editable install), or an installed wheel."""

from __future__ import annotations

from pathlib import Path


def project_root() -> Path | None:
    """The source checkout this package runs from (editable install), or None when installed elsewhere."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "migrations").is_dir():
        return root
    return None
