"""Run the migrator as the CLI does, and a copy of the migrations folder a test may change."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from recon_dagster.cli.commands import main as cli_main
from recon_dagster.db.engine import DATABASE_URL_ENV
from recon_dagster.db.migrate import (
    migrations_dir,
)


def migrate_command(url: str, *options: str) -> int:
    """``recon-dagster migrate [options] --database-url URL``, in this process. The CLI makes its
    URL the process's ``RECON_DATABASE_URL`` (for its children); put the session's back after."""
    saved = os.environ.get(DATABASE_URL_ENV)
    try:
        return cli_main(["migrate", *options, "--database-url", url])
    finally:
        if saved is None:
            os.environ.pop(DATABASE_URL_ENV, None)
        else:
            os.environ[DATABASE_URL_ENV] = saved


def copy_migrations(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for path in migrations_dir().glob("*.sql"):
        shutil.copy(path, dest / path.name)
    return dest
