"""A temporary ``DAGSTER_HOME`` on dagster-postgres (``dagster.yaml`` + ``workspace.yaml``), and
the PostgreSQL databases it and the benchmarks create and drop."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from recon_dagster.db.engine import dagster_storage_url, libpq_url, parse_url, redact, with_database


@dataclass
class DagsterHome:
    """A temporary Dagster instance folder: ``dagster.yaml`` + ``workspace.yaml``.

    The storage URL is not in any file: ``env()`` carries it as ``DAGSTER_POSTGRES_URL``.
    """

    path: Path
    storage_url: str = field(repr=False)
    storage_database: str

    @property
    def dagster_yaml(self) -> Path:
        return self.path / "dagster.yaml"

    @property
    def workspace_yaml(self) -> Path:
        return self.path / "workspace.yaml"

    def env(self) -> dict[str, str]:
        """What a process needs to open this instance."""
        return {"DAGSTER_HOME": str(self.path), "DAGSTER_POSTGRES_URL": self.storage_url}

    @contextlib.contextmanager
    def instance(self) -> Iterator[Any]:
        """This instance, opened in the current process (for reading runs from a test)."""
        import dagster as dg

        saved = {k: os.environ.get(k) for k in self.env()}
        os.environ.update(self.env())
        try:
            with dg.DagsterInstance.from_config(str(self.path)) as inst:
                yield inst
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _instance_yaml(
    *,
    max_concurrent_runs: int,
    kind_run_limit: int | None,
    dequeue_interval_s: int,
    dequeue_workers: int,
    sensor_workers: int,
    submit_workers: int,
    monitoring_poll_s: int,
    provider_run_limits: Mapping[str, int] | None = None,
) -> str:
    limits = ""
    if kind_run_limit is not None:
        limits = (
            "  tag_concurrency_limits:\n"
            '    - key: "recon/provider_kind"\n'
            "      value:\n"
            "        applyLimitPerUniqueValue: true\n"
            f"      limit: {kind_run_limit}\n"
        )
    for provider, limit in (provider_run_limits or {}).items():
        if not limits:
            limits = "  tag_concurrency_limits:\n"
        limits += f'    - key: "recon/provider"\n      value: "{provider}"\n      limit: {limit}\n'
    return (
        "# written by recon_dagster_tests.support.instance.dagster_home\n"
        "storage:\n  postgres:\n    postgres_url:\n      env: DAGSTER_POSTGRES_URL\n"
        "run_queue:\n"
        f"  max_concurrent_runs: {max_concurrent_runs}\n"
        "  dequeue_use_threads: true\n"
        f"  dequeue_num_workers: {dequeue_workers}\n"
        f"  dequeue_interval_seconds: {dequeue_interval_s}\n"
        f"{limits}"
        "run_monitoring:\n  enabled: true\n  start_timeout_seconds: 180\n  cancel_timeout_seconds: 180\n"
        f"  max_resume_run_attempts: 0\n  poll_interval_seconds: {monitoring_poll_s}\n"
        "sensors:\n  use_threads: true\n"
        f"  num_workers: {sensor_workers}\n  num_submit_workers: {submit_workers}\n"
        "schedules:\n  use_threads: true\n  num_workers: 1\n"
        "telemetry:\n  enabled: false\n"
    )


def _workspace_yaml(module: str, location: str) -> str:
    return f"load_from:\n  - python_module:\n      module_name: {module}\n      location_name: {location}\n"


def ensure_database(database_url: str, name: str) -> bool:
    """Create database ``name`` on the server of ``database_url`` if missing; True if created."""
    with psycopg.connect(libpq_url(database_url), autocommit=True, connect_timeout=5) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:
            return False  # another process created it between the check and the create
        return True


def _storage_template(database_url: str, app_db: str) -> str:
    """An empty Dagster storage database (its schema created once per process and app database),
    for ``dagster_home`` to clone: dagster-postgres creating its schema takes 10-20 s, PostgreSQL
    copying a database about one. Dropped by ``drop_storage_template`` or when the process exits."""
    name = f"{app_db}_dagster_tmpl"
    if name in _TEMPLATES:
        return name
    drop_database(database_url, name)  # a leftover of a killed process on the same app database
    ensure_database(database_url, name)
    path = Path(tempfile.mkdtemp(prefix="recon-dagster-template-"))
    storage_url = dagster_storage_url(with_database(database_url, name))
    try:
        (path / "dagster.yaml").write_text(
            "storage:\n  postgres:\n    postgres_url:\n      env: DAGSTER_POSTGRES_URL\n"
            "telemetry:\n  enabled: false\n"
        )
        with DagsterHome(path, storage_url, name).instance():
            pass  # dagster-postgres creates its schema on open
    except BaseException:
        drop_database(database_url, name)
        raise
    finally:
        shutil.rmtree(path, ignore_errors=True)
    # Dropped through the server's maintenance database: the app database may be gone by then.
    _TEMPLATES[name] = with_database(database_url, "postgres")
    return name


_TEMPLATES: dict[str, str] = {}  # template database -> a URL on its server


def drop_storage_template(database_url: str) -> None:
    """Drop the storage template made for ``database_url``'s database (if this process made one)."""
    name = f"{parse_url(database_url).database}_dagster_tmpl"
    server = _TEMPLATES.pop(name, None)
    if server is not None:
        with contextlib.suppress(psycopg.Error):
            drop_database(server, name)


@atexit.register
def _drop_templates() -> None:
    for name, url in list(_TEMPLATES.items()):
        with contextlib.suppress(psycopg.Error):
            drop_database(url, name)
    _TEMPLATES.clear()


def _clone_database(database_url: str, name: str, template: str) -> bool:
    """Create database ``name`` as a copy of ``template`` if missing; True if created."""
    with psycopg.connect(libpq_url(database_url), autocommit=True, connect_timeout=5) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return False
        # A copy needs its template to have no session: ours are closed, a straggler is ended.
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (template,))
        try:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        except psycopg.errors.DuplicateDatabase:
            return False
        return True


def drop_database(database_url: str, name: str) -> None:
    """Drop database ``name`` (connections to it are terminated)."""
    with psycopg.connect(libpq_url(database_url), autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.contextmanager
def dagster_home(
    database_url: str,
    *,
    max_concurrent_runs: int = 10,
    kind_run_limit: int | None = 3,
    dequeue_interval_s: int = 1,
    dequeue_workers: int = 4,
    sensor_workers: int = 2,
    submit_workers: int = 4,
    monitoring_poll_s: int = 5,
    storage_database: str | None = None,
    module: str = "recon_dagster.definitions",
    location: str = "recon_dagster",
    keep_storage: bool = False,
    provider_run_limits: Mapping[str, int] | None = None,
) -> Iterator[DagsterHome]:
    """A temp ``DAGSTER_HOME`` whose storage is ``<db>_dagster`` on the same PostgreSQL.

    The storage database is created if missing (and dropped at exit when created here, unless
    ``keep_storage``), as a copy of an empty storage made once per process (``_storage_template``);
    its schema exists before this yields, so daemon and test never race to create it.
    """
    app_db = parse_url(database_url).database
    if not app_db:
        raise ValueError(f"database URL names no database: {redact(database_url)}")
    name = storage_database or f"{app_db}_dagster"
    created = _clone_database(database_url, name, _storage_template(database_url, app_db))
    storage_url = dagster_storage_url(with_database(database_url, name))
    path = Path(tempfile.mkdtemp(prefix="recon-dagster-home-"))
    home = DagsterHome(path, storage_url, name)
    try:
        home.dagster_yaml.write_text(
            _instance_yaml(
                max_concurrent_runs=max_concurrent_runs,
                kind_run_limit=kind_run_limit,
                dequeue_interval_s=dequeue_interval_s,
                dequeue_workers=dequeue_workers,
                sensor_workers=sensor_workers,
                submit_workers=submit_workers,
                monitoring_poll_s=monitoring_poll_s,
                provider_run_limits=provider_run_limits,
            )
        )
        home.workspace_yaml.write_text(_workspace_yaml(module, location))
        with home.instance():
            pass  # dagster-postgres creates (or upgrades) its schema on open
        yield home
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if created and not keep_storage:
            with contextlib.suppress(psycopg.Error):
                drop_database(database_url, name)


__all__ = ["DagsterHome", "dagster_home", "drop_database", "drop_storage_template", "ensure_database"]
