"""Cost of the app workers' contract as SQL functions (migration 160) next to the Python path before it.

Per call, wall milliseconds from one client on loopback PostgreSQL, each call its own transaction
as a worker makes it:

- each ``recon.*`` function called directly (what a Node or any-language worker pays);
- the Python library now (``make_on_task_created`` / ``mark_provider_call_start`` / the account
  limiter: the same functions through SQLAlchemy);
- the path the library took before the functions (its inline statements, kept below verbatim from
  the release before: the create's intent was three statements, its task id two transactions of
  one and two statements, a token one ``UPDATE``).

Then the round trips per job (statements plus commits, counted at the driver): an async create
whose worker writes the task id by hand (spec 5.2: one ``UPDATE``), the contract through SQL, the
Python library before and now. Nothing here binds a budget (one token per statement, none held
by the process): the figures are the calls' own cost.

    .venv/bin/python benchmarks/app_contract.py [--n 300] [--database-url URL]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from recon_dagster.db import contract
from recon_dagster.db.engine import (
    dispose_engines,
    get_engine,
    normalize_url,
    resolve_database_url,
    with_database,
)
from recon_dagster.db.migrate import migrate
from recon_dagster.providers.limits import AccountLimiter, AccountLimits, Budget
from recon_dagster.reconcile.app_worker import make_on_task_created, mark_provider_call_start
from recon_dagster_tests.support.instance import drop_database, ensure_database

KIND, PROVIDER = "replicate-prediction", "replicate"
PAYLOAD = {"version": "v1", "input": {"prompt": "a lighthouse at dusk"}}

# The statements of the release before migration 160 (db/ledger.py, db/transitions.py,
# providers/limits.py), for the "before" column.
OLD_INTENT = (
    "SELECT pg_advisory_xact_lock(hashtextextended(:j, 148))",
    "SELECT COALESCE(max(seq), 0) + 1 FROM upstream_creates WHERE job_id = :j",
    """INSERT INTO upstream_creates (id, job_id, seq, provider, provider_kind, marker, marker_sent, fingerprint)
       VALUES (:id, :j, :seq, :p, :k, :m, true, 'f') ON CONFLICT (id) DO UPDATE SET id = EXCLUDED.id RETURNING *""",
)
OLD_HELD = "SELECT * FROM upstream_creates WHERE provider = :p AND task_id = :t"
OLD_RECORD = """UPDATE upstream_creates SET task_id = :t, task_recorded_at = now(), state = 'created', state_at = now()
                WHERE id = :id AND task_id IS NULL RETURNING *"""
OLD_ATTACH = """UPDATE jobs SET
  provider_kind = CASE WHEN provider_task_id IS NULL OR provider_task_id = :t THEN :k ELSE provider_kind END,
  provider_task_id = COALESCE(provider_task_id, :t),
  provider_call_started_at = COALESCE(provider_call_started_at, now()), updated_at = now()
WHERE id = :j AND status IN ('pending', 'processing') RETURNING provider_task_id"""
OLD_MARK = """UPDATE jobs SET provider_kind = :k, provider_call_started_at = now(), updated_at = now()
WHERE id = :j AND status IN ('pending', 'processing') RETURNING id"""
OLD_TAKE = """
WITH b AS (
  SELECT account, bucket, rate_per_s,
         LEAST(burst, tokens + 0 + GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - stamp)) * rate_per_s) AS refilled,
         GREATEST(0, EXTRACT(EPOCH FROM stamp - clock_timestamp())) AS blocked_s
  FROM provider_limit_buckets WHERE account = :a AND bucket = 'read' FOR UPDATE
), t AS (SELECT *, 1 AS taken FROM b)
UPDATE provider_limit_buckets p SET tokens = t.refilled - t.taken, stamp = GREATEST(p.stamp, clock_timestamp())
FROM t WHERE p.account = t.account AND p.bucket = t.bucket
RETURNING p.tokens, t.rate_per_s, t.blocked_s, t.taken"""
HAND_WRITTEN = "UPDATE jobs SET provider_task_id = :t, provider_kind = :k WHERE id = :j"


def new_job(engine: sa.Engine) -> str:
    job = str(uuid.uuid4())
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, user_id, job_type, status) VALUES (:j, :u, 'image', 'processing')"
            ),
            {"j": job, "u": str(uuid.uuid4())},
        )
    return job


def per_call_ms(n: int, setup: Callable[[], object], call: Callable[[object], object]) -> float:
    """Median wall ms of ``call(setup())`` over ``n`` calls (the setup is not timed)."""
    times = []
    for _ in range(n):
        arg = setup()
        started = time.perf_counter()
        call(arg)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


@contextmanager
def round_trips(engine: sa.Engine) -> Iterator[list[int]]:
    """Statements and commits the engine sends while inside: ``[count]``."""
    count = [0]

    def one(*_: object) -> None:
        count[0] += 1

    sa.event.listen(engine, "before_cursor_execute", one)
    sa.event.listen(engine, "commit", one)
    try:
        yield count
    finally:
        sa.event.remove(engine, "before_cursor_execute", one)
        sa.event.remove(engine, "commit", one)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    server = (
        normalize_url(args.database_url) if args.database_url else resolve_database_url(allow_embedded=True)
    )
    name = f"recon_bench_{secrets.token_hex(4)}"
    ensure_database(server, name)
    url = with_database(server, name)
    try:
        engine = get_engine(url)
        migrate(engine)
        contract.require(engine)
        limiter = AccountLimiter(
            AccountLimits("bench", reads=Budget(100, 0.001), concurrency=64), lambda: engine
        )
        limiter.ensure()
        n = args.n

        def fn(function: str, **params: object) -> object:
            with engine.begin() as conn:
                return contract.call(conn, function, **params)

        def old_intent(job: object) -> None:
            with engine.begin() as conn:
                for i, text in enumerate(OLD_INTENT):
                    params = {"j": job}
                    if i == 2:
                        params |= {
                            "id": str(uuid.uuid4()),
                            "seq": 1,
                            "p": PROVIDER,
                            "k": KIND,
                            "m": f"{job}.1",
                        }
                    conn.execute(sa.text(text), params)

        def with_intent() -> tuple[str, str]:
            job = new_job(engine)
            with engine.begin() as conn:
                answer = contract.call(
                    conn, "create_intent", job=job, provider=PROVIDER, kind=KIND, fingerprint="f"
                )
            return job, str(answer["create_id"])

        def old_answer(arg: object) -> None:
            job, create = arg  # type: ignore[misc]
            task = uuid.uuid4().hex
            with engine.begin() as conn:
                conn.execute(sa.text(OLD_HELD), {"p": PROVIDER, "t": task})
                conn.execute(sa.text(OLD_RECORD), {"id": create, "t": task})
            with engine.begin() as conn:
                conn.execute(sa.text(OLD_ATTACH), {"j": job, "k": KIND, "t": task})

        def old(text: str, params: dict[str, object]) -> None:
            with engine.begin() as conn:
                conn.execute(sa.text(text), params)

        def lib_answer(job: object) -> None:
            hook = make_on_task_created(str(job), KIND, engine=engine)
            hook.before_send(PROVIDER, KIND, PAYLOAD, True)
            hook(uuid.uuid4().hex)

        def lib_intent(job: object) -> None:
            make_on_task_created(str(job), KIND, engine=engine).before_send(PROVIDER, KIND, PAYLOAD, True)

        rows: list[
            tuple[str, float | None, float | None, float | None]
        ] = []  # step, function, library, before

        def job() -> str:
            return new_job(engine)

        rows.append((
            "a create's intent",
            per_call_ms(n, job, lambda j: fn("create_intent", job=j, provider=PROVIDER, kind=KIND, fingerprint="f")),
            per_call_ms(n, job, lib_intent),
            per_call_ms(n, job, old_intent),
        ))  # fmt: skip
        rows.append((
            "its task id (ledger + row)",
            per_call_ms(n, with_intent, lambda a: fn(
                "create_answered", job=a[0], provider=PROVIDER, kind=KIND, task_id=uuid.uuid4().hex, create=a[1])),  # type: ignore[index]
            None,
            per_call_ms(n, with_intent, old_answer),
        ))  # fmt: skip
        rows.append(("intent + task id (library, whole)", None, per_call_ms(n, job, lib_answer), None))
        rows.append((
            "a sync call's start",
            per_call_ms(n, job, lambda j: fn("mark_call_start", job=j, kind="anthropic-sync")),
            per_call_ms(n, job, lambda j: mark_provider_call_start(str(j), "anthropic-sync", engine=engine)),
            per_call_ms(n, job, lambda j: old(OLD_MARK, {"j": j, "k": "x"})),
        ))  # fmt: skip
        rows.append(("what to resume", per_call_ms(n, job, lambda j: fn("resume_point", job=j)), None, None))
        rows.append((
            "a create lost",
            per_call_ms(n, with_intent, lambda a: fn("create_lost", create=a[1], state="ambiguous", detail="x")),  # type: ignore[index]
            None,
            None,
        ))  # fmt: skip
        rows.append((
            "a read token",
            per_call_ms(n, lambda: None, lambda _: fn("take_token", account="bench", bucket="read", max_wait_s=1.0)),
            per_call_ms(n, lambda: None, lambda _: limiter.take_token(False, 1.0)),
            per_call_ms(n, lambda: None, lambda _: old(OLD_TAKE, {"a": "bench"})),
        ))  # fmt: skip

        def slot_round(_: object) -> None:
            held = fn("take_slot", account="bench", kind="kie-standard", ttl_s=180.0)
            fn("release_slot", account="bench", slot=held["slot"], holder=held["holder"])  # type: ignore[index]

        rows.append(("slot taken + released", per_call_ms(n, lambda: None, slot_round), None, None))
        rows.append((
            "slots renewed (8 holders)",
            per_call_ms(n, lambda: None, lambda _: fn("renew_slots", account="bench", holders=[str(i) for i in range(8)])),
            None,
            None,
        ))  # fmt: skip
        rows.append(
            (
                "token_blocked",
                per_call_ms(n, lambda: None, lambda _: fn("token_blocked", account="bench", bucket="read")),
                None,
                None,
            )
        )
        rows.append(
            (
                "a Retry-After",
                per_call_ms(
                    20, lambda: None, lambda _: fn("record_retry_after", account="bench2", seconds=0.001)
                ),
                None,
                None,
            )
        )

        print(f"median wall ms per call, {n} calls each, one client, loopback PostgreSQL")
        print(f"{'step':36} {'function (SQL)':>15} {'library now':>12} {'before':>8}")
        for step, f, lib, old in rows:
            cells = [f"{v:.3f}" if v is not None else "-" for v in (f, lib, old)]
            print(f"{step:36} {cells[0]:>15} {cells[1]:>12} {cells[2]:>8}")

        # Round trips per job (statements + commits at the driver), an async create answered.
        trips: list[tuple[str, int]] = []
        j = new_job(engine)
        with round_trips(engine) as c, engine.begin() as conn:
            conn.execute(sa.text(HAND_WRITTEN), {"j": j, "k": KIND, "t": uuid.uuid4().hex})
        trips.append(("the app by hand (spec 5.2: one UPDATE)", c[0]))
        j = new_job(engine)
        with round_trips(engine) as c:
            fn("resume_point", job=j)
            created = fn("create_intent", job=j, provider=PROVIDER, kind=KIND, fingerprint="f")
            fn(
                "create_answered",
                job=j,
                provider=PROVIDER,
                kind=KIND,
                task_id=uuid.uuid4().hex,
                create=created["create_id"],
            )  # type: ignore[index]
        trips.append(("the contract through SQL (resume, intent, answered)", c[0]))
        j, create = with_intent()
        with round_trips(engine) as c:
            old_intent(new_job(engine))
            old_answer((j, create))
        trips.append(
            ("the Python library before (intent, ledger, row)", c[0] - 2)
        )  # less new_job's insert + commit
        j = new_job(engine)
        with round_trips(engine) as c:
            lib_answer(j)
        trips.append(("the Python library now (intent, ledger, row)", c[0]))
        print()
        print(f"{'round trips per async create answered':52} {'trips':>5}")
        for label, count in trips:
            print(f"{label:52} {count:>5}")
        print("each read or create token adds one round trip per request (take_token), as before in Python")
    finally:
        dispose_engines()
        drop_database(server, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
