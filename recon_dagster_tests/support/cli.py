"""What a failed `recon-dagster` command printed: its one line, checked."""

from __future__ import annotations

import re
import subprocess


def one_line_failure(out: subprocess.CompletedProcess, command: str, code: int = 1) -> tuple[str, str]:
    """The CLI's failure contract: exit ``code``, stderr's last line ``recon-dagster <cmd>: <what>;
    <how to fix>``, no traceback, no Dagster harness text. Returns (what, fix)."""
    assert out.returncode == code, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    for noise in ("Traceback", "Stack Trace", "Test raised an exception", "Warning:", "site-packages"):
        assert noise not in out.stderr, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    m = re.fullmatch(rf"recon-dagster {command}: (.+?); (.+)", last)
    assert m, out.stderr
    return m.group(1), m.group(2)
