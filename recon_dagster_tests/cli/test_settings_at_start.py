"""Every ``RECON_*`` setting is checked at start: a bad value is one line naming
its variable, from the CLI (exit 1) and as a load error of the definitions, instead of a failed
run or a failed alert later."""

from __future__ import annotations

import subprocess
import sys

import pytest

from recon_dagster.cli import commands as cli
from recon_dagster.definitions import build_defs

NOT_CALLABLE = "a value, not a function"

BAD_SETTINGS = [
    ("RECON_ALERT_HOOK", "no_such_module_for_alerts:alert"),
    ("RECON_ALERT_HOOK", f"{__name__}:NOT_CALLABLE"),
    ("RECON_ALERT_HOOK", f"{__name__}:missing_function"),
    ("RECON_ALERT_HOOK", "just_a_module"),
    ("RECON_NOT_FOUND_BURST", "lots"),
    ("RECON_NOT_FOUND_SHARE", "nan"),
    ("RECON_NOT_FOUND_WINDOW_S", "0"),
    ("RECON_POLL_DEADLINE_S", "inf"),
    ("RECON_POLL_MAX_BYTES", "0"),
    ("RECON_MEDIA_DEADLINE_S", "nan"),
    ("RECON_MEDIA_MIN_BYTES_PER_S", "-5"),
    ("RECON_LEASE_S", "nan"),
    ("RECON_MAX_ATTEMPTS", "0"),
    ("RECON_RECONCILE_CADENCE_S", "inf"),
    ("RECON_RECONCILE_CONCURRENCY", "99999999"),
    ("RECON_BATCH_SIZE", "0"),
    ("RECON_SINGLE_RUN_BELOW", "-1"),
    ("RECON_SCAN_LIMIT", "many"),
    ("RECON_DB_MAX_CONNECTIONS", "nan"),
    ("RECON_DB_MAX_CONNECTIONS", "5"),
    ("RECON_DB_TRANSACTION_POOLER", "maybe"),
    ("RECON_PRECALL_BUDGET_S", "-1"),
    ("RECON_SENSOR_INTERVAL_S", "0"),
    ("RECON_LIMITS", "sometimes"),
    ("RECON_LIMITS_MIGRATE", "maybe"),
    ("RECON_LIMIT_KIE", "reads=600/nan"),
    ("RECON_LIMIT_REPLICATE", "concurrency=2000000"),
    ("RECON_LIMIT_ELEVENLABS", "reads=0"),
    ("RECON_LIMIT_ANTHROPIC", "creates=50/inf"),
    ("RECON_MEDIA_ALLOWED_HOSTS", "host:99999"),
    ("RECON_DAGSTER_UI_URL", "localhost:3000"),
]


def _id(case: tuple[str, str]) -> str:
    return f"{case[0]}={case[1]}"


@pytest.mark.parametrize(("name", "value"), BAD_SETTINGS, ids=[_id(c) for c in BAD_SETTINGS])
def test_every_setting_is_validated_at_start_with_one_line_naming_it(monkeypatch, capsys, name, value):
    monkeypatch.setenv(name, value)

    assert cli.main(["status"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and name in err, err

    with pytest.raises(ValueError) as caught:
        build_defs()
    assert name in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.slow
def test_loading_the_definitions_fails_on_an_alert_hook_that_cannot_be_called(monkeypatch):
    env = {"RECON_ALERT_HOOK": "no_such_module_for_alerts:alert"}
    monkeypatch.setattr("os.environ", {**__import__("os").environ, **env})
    done = subprocess.run(
        [sys.executable, "-c", "import recon_dagster.definitions"],
        env=dict(__import__("os").environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "RECON_ALERT_HOOK" in done.stderr
