"""A real PgBouncer (Debian's ``pgbouncer`` package, installed by .ci/run) on a free loopback port,
in front of the session's PostgreSQL, in transaction mode: every transaction may run on another
server connection, as behind a managed pooler."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from recon_dagster.db.engine import parse_url
from recon_dagster_tests.support.topology import free_port


@dataclass(frozen=True)
class PgBouncer:
    port: int
    folder: Path

    def url(self, database_url: str) -> str:
        """``database_url`` (its user and database) through this PgBouncer."""
        parsed = parse_url(database_url)
        return parsed.set(host="127.0.0.1", port=self.port, query={}).render_as_string(hide_password=False)

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"


def _server_address(database_url: str) -> tuple[str, int, str | None]:
    """(host or socket folder, port, the owner a socket folder needs) of the session's server."""
    parsed = parse_url(database_url)
    socket_dir = parsed.query.get("host")
    if isinstance(socket_dir, str) and socket_dir.startswith("/"):
        return socket_dir, parsed.port or 5432, pwd.getpwuid(os.stat(socket_dir).st_uid).pw_name
    return parsed.host or "127.0.0.1", parsed.port or 5432, None


@contextlib.contextmanager
def pgbouncer(database_url: str, *, pool_size: int = 2) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode, ``pool_size`` server connections per database and user.

    PgBouncer refuses to run as root: as root it runs as the owner of the server's socket folder
    (the embedded server's) or as ``nobody``."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.path.exists(binary):
        raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)")
    host, server_port, owner = _server_address(database_url)
    user = parse_url(database_url).username or "postgres"
    folder = Path(tempfile.mkdtemp(prefix="recon-pgbouncer-"))
    port = free_port()
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={server_port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmin_pool_size = 0\nreserve_pool_size = 0\n"
        "max_client_conn = 500\nserver_reset_query =\nignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {folder / 'pgbouncer.log'}\npidfile = {folder / 'pgbouncer.pid'}\n"
    )
    cmd = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        run_as = owner or "nobody"
        shutil.chown(folder, run_as)
        for child in folder.iterdir():
            shutil.chown(child, run_as)
        cmd[1:1] = ["-u", run_as]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    bouncer = PgBouncer(port, folder)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"pgbouncer exited: {process.stderr.read() if process.stderr else ''}\n{bouncer.log()}"
                )
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not listen on 127.0.0.1:{port}\n{bouncer.log()}")
            time.sleep(0.1)
        yield bouncer
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["PgBouncer", "pgbouncer"]
