"""``crash_point``: a no-op unless armed; armed, it SIGKILLs its own process at the right hit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from recon_dagster.core import crashpoints
from recon_dagster.core.crashpoints import crash_point

# Reaches "a" three times, then "b" once, in threads when asked to; prints what it got past.
SCRIPT = """
import sys, threading
from recon_dagster.core.crashpoints import crash_point
threads = int(sys.argv[1])
def go(i):
    crash_point("a")
    print(f"past a {i}", flush=True)
if threads:
    ts = [threading.Thread(target=go, args=(i,)) for i in range(threads)]
    [t.start() for t in ts]; [t.join() for t in ts]
else:
    for i in range(3):
        go(i)
crash_point("b")
print("past b", flush=True)
"""


def run(env: dict[str, str], threads: int = 0) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RECON_CRASH_")}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(threads)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_unarmed_points_do_nothing() -> None:
    done = run({})
    assert done.returncode == 0 and done.stdout.count("past") == 4


def test_armed_point_kills_with_sigkill_on_the_first_hit() -> None:
    done = run({"RECON_CRASH_AT": "b"})
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.count("past a") == 3 and "past b" not in done.stdout


def test_hits_pick_the_nth_occurrence_and_the_log_records_each(tmp_path: Path) -> None:
    log = tmp_path / "hits.log"
    done = run({"RECON_CRASH_AT": "a, b", "RECON_CRASH_HITS": "2", "RECON_CRASH_LOG": str(log)})
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.splitlines() == ["past a 0"]
    assert [line.split()[1:] for line in log.read_text().splitlines()] == [["a", "1"], ["a", "2"]]


def test_hold_parks_every_thread_at_the_point_until_the_last_arrives() -> None:
    done = run({"RECON_CRASH_AT": "a", "RECON_CRASH_HITS": "5", "RECON_CRASH_HOLD": "1"}, threads=5)
    assert done.returncode == -signal.SIGKILL
    assert "past" not in done.stdout  # none of the five got past the point


def test_probability_with_a_seed_is_reproducible(tmp_path: Path) -> None:
    outs = []
    for _ in range(2):
        log = tmp_path / f"p{len(outs)}.log"
        run(
            {
                "RECON_CRASH_AT": "a",
                "RECON_CRASH_PROB": "0.5",
                "RECON_CRASH_SEED": "3",
                "RECON_CRASH_LOG": str(log),
            }
        )
        outs.append(log.read_text().split()[2] if log.exists() else None)
    assert outs[0] == outs[1]


def test_other_points_and_unarmed_calls_in_process_return(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECON_CRASH_AT", "somewhere.else")
    crashpoints.reset_for_tests()
    try:
        crash_point("finalize.in_settle")  # not armed here: returns
    finally:
        monkeypatch.delenv("RECON_CRASH_AT")
        crashpoints.reset_for_tests()
    crash_point("finalize.in_settle")


def test_every_named_point_is_called_somewhere_in_the_package() -> None:
    root = Path(crashpoints.__file__).parents[1]  # the package, core/ included
    source = "\n".join(p.read_text() for p in root.rglob("*.py") if p.name != "crashpoints.py")
    for point in crashpoints.POINTS:
        assert f'crash_point("{point}")' in source, point
