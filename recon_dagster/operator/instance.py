"""A Dagster instance next to the app database: DAGSTER_HOME with the project's ``dagster.yaml``
and ``DAGSTER_POSTGRES_URL`` pointing at a ``<db>_dagster`` database on the same server.

This is what ``recon-dagster dev`` and the demo use so a fresh clone gets real dagster-postgres
storage (on the embedded server when no RECON_DATABASE_URL is set) with nothing to configure.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from recon_dagster.db.engine import dagster_storage_url, normalize_url, project_root, with_database

POSTGRES_URL_ENV = "DAGSTER_POSTGRES_URL"

_FALLBACK_YAML = """\
storage:
  postgres:
    postgres_url:
      env: DAGSTER_POSTGRES_URL
run_queue:
  max_concurrent_runs: 10
  dequeue_use_threads: true
  dequeue_interval_seconds: 1
  tag_concurrency_limits:
    - key: "recon/provider_kind"
      value:
        applyLimitPerUniqueValue: true
      limit: 3
run_monitoring:
  enabled: true
  max_resume_run_attempts: 0
telemetry:
  enabled: false
"""


def ensure_dagster_database(app_url: str) -> str:
    """Create ``<app db>_dagster`` on the app's server if missing; return its psycopg2 URL."""
    app_url = normalize_url(app_url)
    name = f"{make_url(app_url).database or 'postgres'}_dagster"
    admin = sa.create_engine(app_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            exists = conn.execute(
                sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
            ).first()
            if not exists:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        admin.dispose()
    return dagster_storage_url(with_database(app_url, name))


def prepare_dagster_home(home: Path, app_url: str) -> dict[str, str]:
    """Fill ``home`` with the project's dagster.yaml; return the environment a Dagster process needs."""
    home.mkdir(parents=True, exist_ok=True)
    root = project_root()
    source = root / "dagster.yaml" if root else None
    target = home / "dagster.yaml"
    if source is not None and source.is_file():
        shutil.copyfile(source, target)
    else:
        target.write_text(_FALLBACK_YAML)
    env = {"DAGSTER_HOME": str(home)}
    env[POSTGRES_URL_ENV] = os.environ.get(POSTGRES_URL_ENV) or ensure_dagster_database(app_url)
    return env


LOCATION_NAME = "recon_dagster"
DEFINITIONS_MODULE = "recon_dagster.definitions"


def dagster_dev_argv(home: Path, extra: list[str] | None = None) -> list[str]:
    """``dagster dev`` on this code location under the name ``recon_dagster``.

    ``dagster dev -m <module>`` names the location after the module (``recon_dagster.definitions``
    in the UI); a workspace file can name it. It is written into ``home`` (DAGSTER_HOME) under a
    name of our own, so a workspace.yaml the user keeps there is left alone.
    """
    workspace = home / "recon_dagster_workspace.yaml"
    home.mkdir(parents=True, exist_ok=True)
    workspace.write_text(
        "load_from:\n  - python_module:\n"
        f"      module_name: {DEFINITIONS_MODULE}\n      location_name: {LOCATION_NAME}\n"
    )
    return [sys.executable, "-m", "dagster", "dev", "-w", str(workspace), *(extra or [])]
