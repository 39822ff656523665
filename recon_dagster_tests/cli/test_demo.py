"""The README's first command: the demo reconciles the incident and one stuck row per family, and
shows every row before and after in one table a terminal can hold."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from recon_dagster.cli.demo import DEMO_JOBS


def _demo(env: dict[str, str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recon_dagster.cli", "demo"],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=300,
    )  # fmt: skip


def _rows(stdout: str) -> dict[str, list[str]]:
    """label -> [before status, before credits, after status, after credits, asset, why...]."""
    labels = {j.label for j in DEMO_JOBS}
    rows: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line[:24].strip() in labels:
            current = line[:24].strip()
            before, after, asset, why = line[25:44], line[45:66], line[67:72], line[73:]
            rows[current] = [*before.replace(",", "").split()[:1], " ".join(before.split()[1:]),
                             *after.replace(",", "").split()[:1], " ".join(after.split()[1:]),
                             asset.strip(), why.strip()]  # fmt: skip
        elif current and line.startswith(" " * 73):
            rows[current][-1] += " " + line.strip()
    return rows


@pytest.mark.slow
def test_demo_recovers_the_incident_and_settles_every_family(engine, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "RECON_MEDIA_DIR": str(tmp_path / "media")}

    out = _demo(env, tmp_path)

    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = _rows(out.stdout)
    assert set(rows) == {j.label for j in DEMO_JOBS}, out.stdout
    assert rows["THE INCIDENT: 2K image"] == [
        "processing", "12 held", "completed", "12 charged", "yes",
        "upstream had finished: media stored, credits charged; its workflow runs again",
    ]  # fmt: skip
    assert rows["Flux Kontext edit"][2:] == [
        "failed",
        "10 refunded",
        "-",
        "the provider says it failed: refunded",
    ]
    assert rows["Kling 3.0 video"][2:] == [
        "processing",
        "10 held",
        "-",
        "still generating: attempt 1 of 18, next check in 5 min",
    ]
    assert rows["Runway video"][2:] == [
        "failed",
        "10 refunded",
        "-",
        "result expired upstream before collection: refunded",
    ]
    assert rows["Anthropic ai-writer"][2:] == [
        "failed",
        "10 refunded",
        "-",
        "a sync call dies with its worker: refunded",
    ]
    assert rows["Legacy row (no provider)"][2:] == [
        "failed",
        "10 refunded",
        "-",
        "old row, no provider to ask: refunded",
    ]
    assert all(r[:2] == ["processing", r[1]] and r[1].endswith(" held") for r in rows.values())
    assert any((tmp_path / "media").rglob("*.png"))

    # Fits a 100-column terminal; no word is cut; no internal codes, no noise.
    paths = ("database: ", "media stored in: ", "Dagster home: ")  # as long as the user's paths
    assert all(len(ln) <= 100 for ln in out.stdout.splitlines() if not ln.startswith(paths)), out.stdout
    for noise in (
        "WARNING",
        "Warning",
        "site-packages",
        "recovered=0",
        "reconcile_no_recovery",
        "reconcile:",
    ):
        assert noise not in out.stdout + out.stderr, noise
    assert out.stderr == "", out.stderr
    # Six rows fail and refund and one runs on (KIE's, the sync calls', the legacy row); every other
    # provider's demo row recovers.
    n = len(DEMO_JOBS)
    counts = f"{n} jobs: {n - 7} completed and charged, 6 failed and refunded, 1 still running"
    assert counts in out.stdout
    assert out.stdout.rstrip().splitlines()[-2].startswith("Next: `recon-dagster demo --serve`")

    # A re-run starts from a clean demo state: the previous run's rows go, the counts match again.
    again = _demo(env, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"removed the previous demo run's {n} jobs (the demo user's rows only)" in again.stdout
    assert _rows(again.stdout) == rows
    assert counts in again.stdout
    assert "not found" not in again.stdout
