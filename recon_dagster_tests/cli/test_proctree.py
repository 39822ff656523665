"""`recon-dagster dev` and `demo --serve` stop their whole process tree on
SIGTERM / SIGINT (no webserver, daemon or code server left running)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# A stand-in for `dagster dev`: a parent that starts two long-lived children (webserver, daemon)
# and ignores SIGTERM for a moment, as a slow shutdown would.
FAKE_DEV = textwrap.dedent(
    """
    import subprocess, sys, time, pathlib
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
    pathlib.Path(sys.argv[1]).write_text(" ".join(str(k.pid) for k in kids))
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (its parent has not reaped it yet).
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
def test_stopping_the_parent_stops_the_whole_tree(tmp_path, sig):
    pids_file = tmp_path / "pids"
    fake = tmp_path / "fake_dev.py"
    fake.write_text(FAKE_DEV)
    runner = (
        "import sys; from recon_dagster.cli.proctree import run_process_tree; "
        f"sys.exit(run_process_tree([sys.executable, {str(fake)!r}, {str(pids_file)!r}], grace_s=3))"
    )
    parent = subprocess.Popen([sys.executable, "-c", runner], env={**os.environ})
    deadline = time.monotonic() + 30
    while not (pids_file.exists() and pids_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    kids = [int(p) for p in pids_file.read_text().split()]
    assert all(_alive(k) for k in kids)

    parent.send_signal(sig)
    rc = parent.wait(timeout=30)

    assert rc == 128 + sig
    deadline = time.monotonic() + 10
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [k for k in kids if _alive(k)] == []


def test_dev_and_demo_serve_run_dagster_dev_as_a_process_tree():
    import inspect

    from recon_dagster.cli import commands as cli
    from recon_dagster.cli import demo

    for fn in (cli._cmd_dev, demo._serve):
        src = inspect.getsource(fn)
        assert "run_process_tree(" in src and "subprocess.call(" not in src
