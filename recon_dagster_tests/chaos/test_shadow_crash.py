"""Shadow mode under the fault harness's crash points: `recon-dagster reconcile --once` in shadow,
SIGKILLed at named points, never moves a money row (nor any job, asset or media row)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from recon_dagster_tests.chaos.runner import run_crashing, script
from recon_dagster_tests.support.world import LIMITER_TABLES, fingerprint, money_rows, seed_world

SHADOW_WRITES = LIMITER_TABLES | {"reconcile_decisions", "provider_poll_answers"}


def _env(media_dir: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECON_CRASH_")}
    env.pop("DAGSTER_HOME", None)  # a throwaway instance per run
    return {
        **env,
        "RECON_MODE": "shadow",
        "RECON_MEDIA_DIR": media_dir,
        "RECON_RECONCILE_CADENCE_S": "0",
        **extra,
    }


@pytest.mark.parametrize(
    ("point", "hits", "dies"),
    [
        ("reconcile.after_poll", "1", True),  # the first poll answer in hand, nothing decided
        ("reconcile.after_poll", "4", True),  # some decisions recorded, the rest not
        ("finalize.in_settle", "1", False),  # never reached: shadow opens no settle transaction
        ("refund.in_settle", "1", False),
    ],
)
def test_shadow_killed_at_a_crash_point_moves_no_money(
    db, sandbox, media_dir, tmp_path: Path, point: str, hits: str, dies: bool
) -> None:
    seed_world(db, sandbox)
    money, before = money_rows(db), fingerprint(db, media_dir, skip=SHADOW_WRITES)
    hit_log = tmp_path / "hits.log"
    env = _env(media_dir, RECON_CRASH_AT=point, RECON_CRASH_HITS=hits, RECON_CRASH_LOG=str(hit_log))
    code, killed, tail = run_crashing(
        [script("recon-dagster"), "reconcile", "--once"], env, timeout_s=240, log=tmp_path / "out.log"
    )
    assert not killed, tail
    if dies:
        assert code == -signal.SIGKILL, tail
        assert hit_log.read_text().splitlines()[-1].split()[1:] == [point, hits]
    else:
        assert code == 0, tail
        assert not hit_log.exists()
    assert money_rows(db) == money
    assert fingerprint(db, media_dir, skip=SHADOW_WRITES) == before
    if not dies:
        return
    # And a clean shadow run after the crash still moves nothing.
    code, _, tail = run_crashing(
        [script("recon-dagster"), "reconcile", "--once"],
        _env(media_dir),
        timeout_s=240,
        log=tmp_path / "clean.log",
    )
    assert code == 0, tail
    assert money_rows(db) == money
