"""What the daemon benchmarks share: stale jobs seeded with their credits reserved and their
upstream tasks in the sandbox, counting what is still in flight, verifying that nothing was
settled twice, the account-budget modes, and the checkout's bytecode.

``backlog.py`` and its variants (``ceiling.py``, ``fairness.py``, ``storm.py``) and
``statements.py``, ``run_worker.py`` use it; it uses none of them, so each benchmark imports
only this module and the project (a test keeps the benchmarks free of import circles).
"""

from __future__ import annotations

import os
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml
from sqlalchemy.dialects import postgresql as pg

from recon_dagster.config import Settings, limit_name
from recon_dagster.core.kinds import ASYNC_KINDS, SYNC_KINDS, get_kind, provider_specs

ROOT = Path(__file__).resolve().parents[1]
# The test harness (recon_dagster_tests) is not installed: the benchmarks that use this module
# import it from the checkout.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WATERMARK: dict[str, bool | None] = {"default": None, "on": True, "off": False}

# The account budgets a run works under (--limits); "unbounded" still takes every token from the
# shared buckets in PostgreSQL, so its cost is in the figure, but no budget ever binds.
_UNBOUNDED = "reads=1000000/60,creates=1000000/60,concurrency=none"
# Every registered provider's account (it listed four by hand and missed fal).
_EVERY_ACCOUNT_UNBOUNDED = {limit_name(spec.name): _UNBOUNDED for spec in provider_specs()}
LIMIT_MODES: dict[str, dict[str, str]] = {
    "unbounded": {Settings.limits.name: "database", **_EVERY_ACCOUNT_UNBOUNDED},
    "shipped": {Settings.limits.name: "database"},
    "process": {Settings.limits.name: "process", **_EVERY_ACCOUNT_UNBOUNDED},
}
TARGET_RATIO = 40
USER_CREDITS = Decimal(1_000_000)
JOB_COST = Decimal(2)


@dataclass
class Seeded:
    job_ids: list[str]
    users: list[str]
    expected: Counter[str]  # expected terminal status -> count


@contextmanager
def throwaway_database() -> Iterator[str]:
    """A new database on the configured server (or the embedded one), its URL; dropped on the way
    out, every engine of this process disposed first."""
    import secrets

    from recon_dagster.db.engine import dispose_engines, resolve_database_url, with_database

    server_url = resolve_database_url(allow_embedded=True)
    name = f"recon_bench_{secrets.token_hex(4)}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(server_url, name)
    finally:
        dispose_engines()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def insert_jobs(
    engine: sa.Engine,
    job_ids: list[str],
    user_of: list[str],
    kinds: list[str],
    task_ids: list[str | None],
    ages: list[float],
    *,
    watermark: bool | None = None,
) -> None:
    """Bulk-insert in-flight jobs (provider call started ``ages`` seconds ago), their users'
    balances and their reserved credits, in one transaction. ``watermark`` is every row's
    ``should_watermark`` (None, the host app's default, watermarks like true)."""
    per_user = Counter(user_of)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO user_credits (user_id, subscription_credits, topup_credits) "
                "SELECT u, :credits - CAST(n AS numeric) * :cost, 0 FROM unnest(:users, :counts) AS t(u, n)"
            ).bindparams(
                sa.bindparam("users", type_=pg.ARRAY(pg.UUID)),
                sa.bindparam("counts", type_=pg.ARRAY(sa.Integer)),
            ),
            {
                "users": list(per_user),
                "counts": list(per_user.values()),
                "credits": USER_CREDITS,
                "cost": JOB_COST,
            },
        )
        conn.execute(
            sa.text(
                """
                INSERT INTO jobs (id, user_id, job_type, status, provider_kind, provider_task_id,
                                  provider_call_started_at, created_at, should_watermark)
                SELECT id, u, CASE WHEN k = 'replicate-training' THEN 'lora-training' ELSE 'image' END,
                       'processing', k, t,
                       now() - make_interval(secs => a), now() - make_interval(secs => a + 5),
                       CAST(:watermark AS boolean)
                FROM unnest(:ids, :users, :kinds, :tasks, :ages) AS s(id, u, k, t, a)
                """
            ).bindparams(
                sa.bindparam("ids", type_=pg.ARRAY(pg.UUID)),
                sa.bindparam("users", type_=pg.ARRAY(pg.UUID)),
                sa.bindparam("kinds", type_=pg.ARRAY(sa.Text)),
                sa.bindparam("tasks", type_=pg.ARRAY(sa.Text)),
                sa.bindparam("ages", type_=pg.ARRAY(sa.Float)),
            ),
            {
                "ids": job_ids,
                "users": user_of,
                "kinds": kinds,
                "tasks": task_ids,
                "ages": ages,
                "watermark": watermark,
            },
        )
        conn.execute(
            sa.text(
                """
                INSERT INTO usage_logs (job_id, user_id, status, amount, metadata)
                SELECT id, u, 'reserved', :cost,
                       jsonb_build_object('from_sub', CAST(:cost AS text), 'from_topup', '0')
                FROM unnest(:ids, :users) AS s(id, u)
                """
            ).bindparams(
                sa.bindparam("ids", type_=pg.ARRAY(pg.UUID)), sa.bindparam("users", type_=pg.ARRAY(pg.UUID))
            ),
            {"ids": job_ids, "users": user_of, "cost": JOB_COST},
        )


def seed(
    engine: sa.Engine,
    sandbox,
    count: int,
    *,
    prefix: str,
    fail_share: float,
    sync_share: float,
    media_bytes: int,
    rng: random.Random,
    watermark: bool | None = None,
) -> Seeded:
    """Stale rows with reserved credits (bulk SQL) and their upstream tasks in the sandbox.

    Each task's id is made by the sandbox in its provider's own shape (the family's
    ``new_task_id`` in the provider's sandbox plugin): a fal id carries its app, and an id of
    another shape is answered not-found (every fal job of a backlog was held by the breaker, and
    the benchmark never finished). ``prefix`` is kept for the callers; the ids no longer use it."""
    users = [str(uuid.uuid4()) for _ in range(max(1, min(100, count // 20)))]
    job_ids, kinds, user_of = [], [], []
    task_ids: list[str | None] = []
    specs: list[tuple[str, dict[str, object], None]] = []
    seeded_rows: list[int] = []  # the rows whose task the sandbox holds, in the order of specs
    expected: Counter[str] = Counter()
    for i in range(count):
        job_id = str(uuid.uuid4())
        roll = rng.random()
        if roll < sync_share:
            kind, task_id = rng.choice(SYNC_KINDS), None
            expected["failed"] += 1
        else:
            kind = rng.choice(ASYNC_KINDS)
            task_id = None  # the sandbox's, below
            outcome = "fail" if roll < sync_share + fail_share else "succeed"
            expected["failed" if outcome == "fail" else "completed"] += 1
            seeded_rows.append(i)
            specs.append(
                (kind, {"outcome": outcome, "polls_before_done": 0, "media_size": media_bytes}, None)
            )
        job_ids.append(job_id)
        kinds.append(kind)
        task_ids.append(task_id)
        user_of.append(users[i % len(users)])

    started = time.monotonic()
    for row, made in zip(seeded_rows, sandbox.add_tasks(specs), strict=True):
        task_ids[row] = made
    log(f"  seeded {len(specs):,} sandbox tasks in {time.monotonic() - started:.1f} s")

    started = time.monotonic()
    # Every row's provider call started well past its kind's threshold (the longest is 75 min).
    age_s = max(get_kind(k).stale_threshold.total_seconds() for k in set(kinds)) + 600
    insert_jobs(engine, job_ids, user_of, kinds, task_ids, [age_s] * count, watermark=watermark)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE jobs")
        conn.exec_driver_sql("ANALYZE usage_logs")
    log(f"  seeded {count:,} jobs with reserved credits in {time.monotonic() - started:.1f} s")
    return Seeded(job_ids, users, expected)


def connections(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity")).scalar_one())


def inflight(engine: sa.Engine, ids: list[str]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[])) AND status IN ('pending', 'processing')"
                ),
                {"ids": ids},
            ).scalar_one()
        )


def verify(engine: sa.Engine, seeded: Seeded) -> list[str]:
    """Every way the backlog could have been settled wrongly; empty when all is right."""
    problems = []
    ids = seeded.job_ids
    with engine.connect() as conn:
        statuses = Counter(
            dict(
                conn.execute(
                    sa.text(
                        "SELECT status, count(*) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[])) GROUP BY status"
                    ),
                    {"ids": ids},
                ).all()
            )
        )
        if statuses != seeded.expected:
            problems.append(f"job statuses {dict(statuses)} != expected {dict(seeded.expected)}")
        bad = conn.execute(
            sa.text(
                """
                SELECT count(*) FILTER (WHERE n <> 1) AS not_one,
                       count(*) FILTER (WHERE j.status = 'completed' AND u.status <> 'committed') AS completed_unpaid,
                       count(*) FILTER (WHERE j.status = 'failed' AND u.status <> 'refunded') AS failed_unrefunded
                FROM jobs j
                JOIN LATERAL (SELECT count(*) AS n, min(status) AS status FROM usage_logs WHERE job_id = j.id) u ON true
                WHERE j.id = ANY(CAST(:ids AS uuid[]))
                """
            ),
            {"ids": ids},
        ).one()
        if any(bad):
            problems.append(
                f"usage_logs: {bad.not_one} jobs without exactly one log, {bad.completed_unpaid} completed "
                f"but not committed, {bad.failed_unrefunded} failed but not refunded"
            )
        leaks = conn.execute(
            sa.text(
                """
                SELECT count(*) FROM user_credits c
                WHERE c.user_id = ANY(CAST(:users AS uuid[]))
                  AND c.subscription_credits + c.topup_credits
                      + COALESCE((SELECT sum(amount) FROM usage_logs u
                                  WHERE u.user_id = c.user_id AND u.status = 'committed'), 0) <> :credits
                """
            ),
            {"users": seeded.users, "credits": USER_CREDITS},
        ).scalar_one()
        if leaks:
            problems.append(f"{leaks} users whose balance + committed credits != {USER_CREDITS}")
        multi = conn.execute(
            sa.text(
                """
                SELECT count(*) FROM (
                  SELECT job_id FROM reconcile_events
                  WHERE job_id = ANY(CAST(:ids AS uuid[])) AND outcome IN ('recovered', 'failed', 'swept', 'exhausted')
                  GROUP BY job_id HAVING count(*) > 1) d
                """
            ),
            {"ids": ids},
        ).scalar_one()
        if multi:
            problems.append(f"{multi} jobs with more than one terminal reconcile outcome")
        assets = conn.execute(
            sa.text("SELECT count(*) FROM assets WHERE job_id = ANY(CAST(:ids AS uuid[]))"), {"ids": ids}
        ).scalar_one()
        if assets != seeded.expected["completed"]:
            problems.append(f"{assets} assets for {seeded.expected['completed']} completed jobs")
    return problems


def compile_project() -> None:
    """Give this checkout's modules their bytecode, as ``pip install`` of the wheel gives an
    installed package (and the venv's packages already have theirs).

    With ``PYTHONDONTWRITEBYTECODE`` set, as on the project's machines, every process of the daemon
    tree would otherwise compile the checkout from source at each import. An earlier fix pointed
    ``PYTHONPYCACHEPREFIX`` at a fresh folder instead: Python then ignores every ``__pycache__``,
    so the daemon, the code servers and the first run workers compiled Dagster, SQLAlchemy and the
    rest from source too: 8% of the tree's py-spy samples (2026-12-03).
    """
    import compileall

    import recon_dagster

    compileall.compile_dir(os.path.dirname(recon_dagster.__file__), quiet=1)


def shipped_run_queue(home_yaml: Path) -> dict[str, Any]:
    """Give the benchmark's instance the run-queue limits that ship (dagster.yaml)."""
    shipped = yaml.safe_load((ROOT / "dagster.yaml").read_text())["run_queue"]
    config = yaml.safe_load(home_yaml.read_text())
    for key in ("max_concurrent_runs", "tag_concurrency_limits"):
        config["run_queue"][key] = shipped[key]
    home_yaml.write_text(yaml.safe_dump(config, sort_keys=False))
    return config["run_queue"]
