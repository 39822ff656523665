"""A seeded world with every situation reconciliation meets, and a fingerprint of everything stored.

Used by the plan, shadow and cross-mode tests: each job is named by the decision it should get.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import make_job, make_user, reserve

# Tables a polling plan may touch: the provider account's shared rate-limit tokens and slots.
LIMITER_TABLES = frozenset({"provider_limit_accounts", "provider_limit_buckets", "provider_limit_slots"})


def seed_world(engine: sa.Engine, sandbox: Any) -> dict[str, uuid.UUID]:
    """One job per situation; returns {name: job id}. Names say what enforce does to each."""
    user = make_user(engine, sub=500, topup=500)
    jobs: dict[str, uuid.UUID] = {}

    def job(
        name: str, kind: str | None, scenario: Scenario | None, minutes: float | None = 60, **kw: Any
    ) -> uuid.UUID:
        task = sandbox.add_task(kind, scenario) if scenario is not None and kind else kw.pop("task", None)
        jobs[name] = make_job(
            engine, user, provider_kind=kind, provider_task_id=task, started_minutes_ago=minutes, **kw
        )
        return jobs[name]

    done = Scenario(polls_before_done=0)
    reserve(engine, job("complete", "kie-standard", done), user, 10, 6, 4)
    # Reserved twice: completing commits the oldest, refunds the other.
    a = job("complete_twice_reserved", "replicate-prediction", done)
    reserve(engine, a, user, 5, 5, 0)
    reserve(engine, a, user, 3, 1, 2)
    reserve(engine, job("fail", "kie-kontext", Scenario(outcome="fail", polls_before_done=0)), user, 8, 2, 6)
    reserve(engine, job("fail_not_found", "kie-veo", None, task="no-such-task"), user, 4, 4, 0)
    reserve(engine, job("running", "kie-kling3", Scenario(outcome="run_forever")), user, 7, 7, 0)
    reserve(
        engine,
        job("force_fail", "kie-kling3", Scenario(outcome="run_forever"), reconcile_attempts=17),
        user,
        6,
        0,
        6,
    )
    reserve(engine, job("sweep_sync", "elevenlabs-sync", None), user, 2, 2, 0)
    reserve(engine, job("sweep_legacy", None, None, minutes=None, created_minutes_ago=400), user, 3, 3, 0)
    reserve(engine, job("not_stale", "kie-veo", Scenario(polls_before_done=0), minutes=1), user, 9, 9, 0)
    leased = job("leased", "kie-standard", done)
    takeover = job("takeover_at_cap", "kie-kling3", Scenario(outcome="run_forever"), reconcile_attempts=17)
    waiting = job("cadence", "kie-standard", done)
    job("finished", "kie-standard", done, status="completed")
    reserve(engine, takeover, user, 5, 5, 0)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_lease_owner = 'live-run', "
                "reconcile_lease_expires_at = now() + interval '10 minutes' WHERE id = :j"
            ),
            {"j": str(leased)},
        )
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_lease_owner = 'dead-run', "
                "reconcile_lease_expires_at = now() - interval '1 minute' WHERE id = :j"
            ),
            {"j": str(takeover)},
        )
        conn.execute(
            sa.text("UPDATE jobs SET reconcile_next_at = now() + interval '4 minutes' WHERE id = :j"),
            {"j": str(waiting)},
        )
    # A timestamp PostgreSQL holds as -infinity: polled like any other, flagged once by enforce.
    nonfinite = job("nonfinite", "kie-standard", done)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET provider_call_started_at = '-infinity' WHERE id = :j"),
            {"j": str(nonfinite)},
        )
    return jobs


def fingerprint(
    engine: sa.Engine, media_dir: str | Path | None = None, *, skip: frozenset[str] = frozenset()
) -> dict[str, str]:
    """A digest of every row of every table (ordered) and of every file under ``media_dir``."""
    out: dict[str, str] = {}
    with engine.connect() as conn:
        tables = (
            conn.execute(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"))
            .scalars()
            .all()
        )
        for t in tables:
            if t in skip:
                continue
            out[t] = conn.execute(
                sa.text(
                    f"SELECT md5(coalesce(string_agg(x::text, E'\\n' ORDER BY x::text), '')) FROM \"{t}\" x"
                )
            ).scalar_one()
    if media_dir is not None:
        h = hashlib.sha256()
        for p in sorted(Path(media_dir).rglob("*")):
            h.update(str(p.relative_to(media_dir)).encode())
            if p.is_file():
                h.update(p.read_bytes())
        out["<media>"] = h.hexdigest()
    return out


def money_rows(engine: sa.Engine) -> list[tuple[Any, ...]]:
    """Every money row: usage logs and balances, ordered."""
    with engine.connect() as conn:
        logs = conn.execute(
            sa.text("SELECT id, job_id, status, amount, settled_at FROM usage_logs ORDER BY id")
        ).all()
        bal = conn.execute(
            sa.text("SELECT user_id, subscription_credits, topup_credits FROM user_credits ORDER BY user_id")
        ).all()
    return [tuple(r) for r in logs] + [tuple(r) for r in bal]


# What plan, shadow and enforce decide for each job ``seed_world`` seeds, and its credit columns.
WORLD_DECISIONS = {
    "complete": ("complete", ("10", "0", "0")),
    "complete_twice_reserved": ("complete", ("5", "1", "2")),
    "fail": ("fail", ("0", "2", "6")),
    "fail_not_found": ("fail", ("0", "4", "0")),
    "running": ("leave_alone", ("0", "0", "0")),
    "force_fail": ("force_fail", ("0", "0", "6")),
    "sweep_sync": ("sweep", ("0", "2", "0")),
    "sweep_legacy": ("sweep", ("0", "3", "0")),
    "not_stale": ("leave_alone", ("0", "0", "0")),
    "leased": ("leave_alone", ("0", "0", "0")),
    "takeover_at_cap": ("force_fail", ("0", "5", "0")),
    "cadence": ("leave_alone", ("0", "0", "0")),
    "nonfinite": ("complete", ("0", "0", "0")),
}
