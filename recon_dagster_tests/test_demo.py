"""The README's first command: the demo reconciles the incident and one stuck row per family."""

from __future__ import annotations

import os
import subprocess
import sys


def test_demo_recovers_the_incident_and_settles_every_family(engine, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "RECON_MEDIA_DIR": str(tmp_path / "media")}

    out = subprocess.run(
        [sys.executable, "-m", "recon_dagster.cli", "demo"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip

    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {line[:48].strip(): line[48:].split() for line in out.stdout.splitlines() if line[:1].isalpha()}
    assert rows["THE INCIDENT: nano-banana-pro 2K image"][:3] == ["kie-standard", "completed", "committed"]
    assert rows["Flux Kontext edit (upstream failed)"][:3] == ["kie-kontext", "failed", "refunded"]
    assert rows["Kling 3.0 video (still generating)"][:3] == ["kie-kling3", "processing", "reserved"]
    assert rows["Anthropic ai-writer (sync)"][:3] == ["anthropic-sync", "failed", "refunded"]
    assert rows["Legacy row from before Phase 1"][:3] == ["(none)", "failed", "refunded"]
    assert "workflow execution of the incident's node: completed" in out.stdout
    assert any((tmp_path / "media").rglob("*.png"))
