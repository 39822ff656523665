"""Run a child (``dagster dev``) as a process tree that stops with us.

``dagster dev`` starts a webserver, a daemon and a code server; killed with SIGTERM, a plain
``subprocess.call`` parent dies alone and leaves all of them running (holding port 3000 and the
instance's storage). Here the child leads a process group of its own, our SIGTERM / SIGINT are
forwarded to that whole group, and whatever is still alive after ``grace_s`` is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def run_process_tree(argv: Sequence[str], env: Mapping[str, str] | None = None, grace_s: float = 20.0) -> int:
    """Run ``argv`` to its end; on SIGTERM / SIGINT stop its whole tree. Returns its exit code
    (130 / 143 when stopped by a signal, like a shell)."""
    proc = subprocess.Popen(list(argv), env=dict(env) if env is not None else None, start_new_session=True)
    stopped: list[int] = []

    def _stop(signum: int, _frame: object) -> None:
        if not stopped:
            stopped.append(signum)
            _signal_group(proc.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, _stop) for s in STOP_SIGNALS}
    try:
        deadline: float | None = None
        while proc.poll() is None:
            if stopped and deadline is None:
                deadline = time.monotonic() + grace_s
            if deadline is not None and time.monotonic() > deadline:
                _signal_group(proc.pid, signal.SIGKILL)
            time.sleep(0.1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        # The child is gone; members of its group that outlived it (a daemon it did not reap) go too.
        if _signal_group(proc.pid, signal.SIGTERM):
            time.sleep(min(grace_s, 2.0))
            _signal_group(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if stopped:
        return 128 + stopped[0]
    return proc.returncode
