"""``recon-dagster demo``: the incident that started all this, reconciled end to end.

Starts (or reuses) the configured PostgreSQL (with no ``RECON_DATABASE_URL``, the embedded one:
the demo opts in to it, ``cli/commands.py``) and the loopback provider
sandbox, seeds the stuck KIE nano-banana-pro 2K image job (processing at 92% for 10 hours, its
upstream task long finished) next to one stuck row of every other provider family, then runs one
``reconcile --once`` through the real sensor and jobs, and prints what happened to each row.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from recon_dagster.cli.errors import require_installed
from recon_dagster.cli.proctree import run_process_tree
from recon_dagster.config import Settings, settings
from recon_dagster.core.kinds import provider_specs
from recon_dagster.db import credits
from recon_dagster.db.engine import get_engine, redact, resolve_database_url
from recon_dagster.db.migrate import migrate
from recon_dagster.operator.instance import dagster_dev_argv, prepare_dagster_home

if TYPE_CHECKING:
    from recon_dagster.sandbox import SandboxServer


@dataclass(frozen=True)
class DemoJob:
    label: str
    kind: str | None
    job_type: str
    minutes_stuck: float
    scenario: dict[str, Any] | None  # sandbox Scenario fields; None: no upstream task (sync / legacy)
    progress: int = 50
    cost: int = 10


def _demo_jobs() -> tuple[DemoJob, ...]:
    """Every provider's demo rows (its spec's ``demo``), in the registry's order, then a legacy row."""
    cases = [case for spec in provider_specs() for case in spec.demo]
    return (
        *(
            DemoJob(c.label, c.kind, c.job_type, c.minutes_stuck, dict(c.scenario) if c.scenario else None,
                    c.progress, c.cost)
            for c in cases
        ),
        # Past the 3-hour pre-call budget: a row that never reached a provider call is swept only then.
        DemoJob("Legacy row (no provider)", None, "image", 200, None),
    )  # fmt: skip


DEMO_JOBS: tuple[DemoJob, ...] = _demo_jobs()


# Every demo row belongs to this user: a re-run removes the previous run's rows first, and a
# demo against a real database never touches anyone else's.
DEMO_USER = uuid.uuid5(uuid.NAMESPACE_URL, "recon-dagster:demo-user")


def _clear_previous(engine: sa.Engine) -> int:
    """Delete every row a previous demo run left (its jobs, credits, assets, events); return the job count."""
    u = {"u": str(DEMO_USER)}
    with engine.begin() as conn:
        ids = [str(i) for i in conn.execute(sa.text("SELECT id FROM jobs WHERE user_id = :u"), u).scalars()]
        if ids:
            by_job = {"ids": ids}
            for table in ("reconcile_events", "assets", "usage_logs", "credit_anomalies"):
                conn.execute(sa.text(f"DELETE FROM {table} WHERE job_id = ANY(CAST(:ids AS uuid[]))"), by_job)
        for table in ("characters", "jobs", "workflow_executions", "user_credits"):
            conn.execute(sa.text(f"DELETE FROM {table} WHERE user_id = :u"), u)
    return len(ids)


def _seed(engine: sa.Engine, sandbox: SandboxServer) -> tuple[uuid.UUID, list[tuple[DemoJob, uuid.UUID]]]:
    from recon_dagster.sandbox import Scenario

    user = DEMO_USER
    seeded: list[tuple[DemoJob, uuid.UUID]] = []
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO user_credits (user_id, subscription_credits, topup_credits) VALUES (:u, 100, 100)"
            ),
            {"u": str(user)},
        )
        workflow = conn.execute(
            sa.text(
                "INSERT INTO workflow_executions (user_id, status, failed_nodes, error_message) "
                "VALUES (:u, 'failed', '[\"node-image-1\"]', 'node node-image-1 timed out') RETURNING id"
            ),
            {"u": str(user)},
        ).scalar_one()
        for job in DEMO_JOBS:
            task_id = (
                sandbox.add_task(job.kind, Scenario(**job.scenario)) if job.scenario and job.kind else None
            )
            incident = job.kind == "kie-standard"
            job_id = conn.execute(
                sa.text(
                    """
                    INSERT INTO jobs (user_id, job_type, status, input_data, progress, started_at,
                      should_watermark, is_public, provider_kind, provider_task_id,
                      provider_call_started_at, workflow_execution_id, node_id, created_at)
                    VALUES (:u, :t, 'processing', CAST(:input AS jsonb), :p,
                      now() - make_interval(secs => :m * 60), :wm, NULL, :k, :task,
                      CASE WHEN CAST(:k AS text) IS NULL THEN NULL ELSE now() - make_interval(secs => :m * 60) END,
                      :wf, :node, now() - make_interval(secs => :m * 60))
                    RETURNING id
                    """
                ),
                {
                    "u": str(user),
                    "t": job.job_type,
                    "input": json.dumps(
                        {"model": "nano-banana-pro", "resolution": "2K"} if incident else {"demo": job.label}
                    ),
                    "p": job.progress,
                    "m": job.minutes_stuck,
                    "wm": incident,
                    "k": job.kind,
                    "task": task_id,
                    "wf": str(workflow) if incident else None,
                    "node": "node-image-1" if incident else None,
                },
            ).scalar_one()
            credits.reserve_credits_for_job(conn, job_id, user, job.cost)
            if job.kind == "replicate-training":
                conn.execute(
                    sa.text(
                        "INSERT INTO characters (user_id, name, training_status, replicate_training_id, training_job_id, training_started_at) "
                        "VALUES (:u, 'demo character', 'training', :task, :j, now() - interval '35 minutes')"
                    ),
                    {"u": str(user), "task": task_id, "j": str(job_id)},
                )
            seeded.append((job, job_id))
    return user, seeded


def _dagster_env(database_url: str) -> dict[str, str]:
    """DAGSTER_HOME as the user set it, else a project-local one with dagster-postgres storage."""
    if os.environ.get("DAGSTER_HOME"):
        return {}
    return prepare_dagster_home(Path.cwd() / ".recon" / "dagster_home", database_url)


# --- the table: before and after, in plain words -------------------------------------------------

_COLUMNS = ((24, "job"), (19, "before"), (21, "after"), (5, "asset"))
_WIDTH = 100
_WHY_WIDTH = _WIDTH - sum(w + 1 for w, _ in _COLUMNS)


@dataclass(frozen=True)
class RowState:
    status: str
    progress: int
    credits: str | None  # usage_logs.status: reserved, committed, refunded
    cost: int
    assets: int
    outcome: str | None  # the last reconcile_events outcome
    detail: str | None
    attempts: int


_CREDIT_WORDS = {"reserved": "held", "committed": "charged", "refunded": "refunded"}


def _credits(state: RowState) -> str:
    return f"{state.cost} {_CREDIT_WORDS.get(state.credits or '', state.credits or 'none')}"


def why(job: DemoJob, state: RowState, max_attempts: int, cadence_min: int, workflow: str | None) -> str:
    """What happened to one row and why, in plain words (no status codes, no internal names)."""
    detail = (state.detail or "").lower()
    if state.status == "completed":
        text = "upstream had finished: media stored, credits charged"
        if job.kind == "kie-standard" and workflow == "completed":
            text += "; its workflow runs again"
        return text
    if state.status == "processing":
        if state.outcome == "error":
            return f"the provider did not answer: next try in {cadence_min} min"
        return (
            f"still generating: attempt {state.attempts} of {max_attempts}, next check in {cadence_min} min"
        )
    if state.outcome == "swept":
        if job.kind is None:
            return "old row, no provider to ask: refunded"
        return "a sync call dies with its worker: refunded"
    if state.outcome == "exhausted":
        return f"unfinished after {max_attempts} attempts: refunded"
    if "expired" in detail:
        return "result expired upstream before collection: refunded"
    if "not found" in detail:
        return "the provider no longer knows the task: refunded"
    if state.outcome == "failed":
        return "the provider says it failed: refunded"
    return f"{state.status}, credits {_credits(state)}"


def _table_lines(cells: list[str], why_text: str) -> list[str]:
    import textwrap

    first = " ".join(f"{c[:w]:<{w}}" for c, (w, _) in zip(cells, _COLUMNS, strict=True))
    wrapped = textwrap.wrap(why_text, _WHY_WIDTH, break_long_words=False) or [""]
    pad = " " * (len(first) + 1)
    return [f"{first} {wrapped[0]}".rstrip()] + [f"{pad}{w}" for w in wrapped[1:]]


def _load_states(
    engine: sa.Engine, seeded: list[tuple[DemoJob, uuid.UUID]]
) -> tuple[dict[str, RowState], str | None]:
    ids = [str(j) for _, j in seeded]
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                """
                SELECT j.id, j.status, j.progress, j.reconcile_attempts,
                  (SELECT status FROM usage_logs u WHERE u.job_id = j.id ORDER BY u.created_at LIMIT 1) AS credits,
                  (SELECT count(*) FROM assets a WHERE a.job_id = j.id) AS assets,
                  e.outcome, e.detail
                FROM jobs j
                LEFT JOIN LATERAL (SELECT outcome, detail FROM reconcile_events r WHERE r.job_id = j.id
                                   ORDER BY r.id DESC LIMIT 1) e ON true
                WHERE j.id = ANY(CAST(:ids AS uuid[]))
                """
            ),
            {"ids": ids},
        ).mappings()
        cost = {str(j): job.cost for job, j in seeded}
        states = {
            str(r["id"]): RowState(
                r["status"],
                r["progress"],
                r["credits"],
                cost[str(r["id"])],
                int(r["assets"]),
                r["outcome"],
                r["detail"],
                int(r["reconcile_attempts"]),
            )  # fmt: skip
            for r in rows
        }
        workflow = conn.execute(
            sa.text("SELECT status FROM workflow_executions WHERE user_id = :u LIMIT 1"),
            {"u": str(DEMO_USER)},
        ).scalar()
    return states, workflow


def print_table(
    seeded: list[tuple[DemoJob, uuid.UUID]],
    before: dict[str, RowState],
    after: dict[str, RowState] | None,
    workflow: str | None,
) -> None:
    """Every seeded row, before and (when given) after, in one table of at most 100 columns."""
    now = settings()
    max_attempts = now.max_attempts
    cadence_min = max(1, round(now.reconcile_cadence_s / 60))
    print(" ".join(f"{h:<{w}}" for w, h in _COLUMNS) + " why")
    print("-" * _WIDTH)
    for job, job_id in seeded:
        b = before[str(job_id)]
        cells = [job.label, f"{b.status}, {_credits(b)}"]
        if after is None:
            what = "waiting for the sensor" if job.kind else "waiting for the sweep"
            cells += ["", ""]
        else:
            a = after[str(job_id)]
            cells += [f"{a.status}, {_credits(a)}", "yes" if a.assets else "-"]
            what = why(job, a, max_attempts, cadence_min, workflow)
        for line in _table_lines(cells, what):
            print(line)


def _counts(seeded: list[tuple[DemoJob, uuid.UUID]], after: dict[str, RowState]) -> str:
    from collections import Counter

    c = Counter(after[str(j)].status for _, j in seeded)
    return (
        f"{len(seeded)} jobs: {c['completed']} completed and charged, {c['failed']} failed and refunded, "
        f"{c['processing']} still running"
    )


@contextmanager
def _quiet_console(verbose: bool) -> Iterator[None]:
    """Dagster's per-run console records off (the table tells the story; every run's log is in the
    Dagster instance, and ``-v`` shows them here)."""
    if verbose:
        yield
        return
    with open(os.devnull, "w") as devnull, redirect_stderr(devnull):
        yield


def run_demo(*, serve: bool = False, port: int = 0, verbose: bool = False) -> int:
    from recon_dagster.cli.run_once import reconcile_once
    from recon_dagster.sandbox import SandboxServer

    if serve:
        require_installed("dagster_webserver", "webserver", "`demo --serve` (`dagster dev`)")
    url = resolve_database_url()
    engine = get_engine(url)
    applied = migrate(engine)
    print(f"database: {redact(url)} (migrations applied now: {len(applied)})")
    os.environ.setdefault(Settings.media_dir.name, str(Path.cwd() / ".recon" / "media"))
    removed = _clear_previous(engine)
    if removed:
        print(f"removed the previous demo run's {removed} jobs (the demo user's rows only)")

    with SandboxServer(port=port) as sandbox:
        os.environ.update(sandbox.env())
        print(f"provider sandbox: {sandbox.base_url}")
        _, seeded = _seed(engine, sandbox)
        before, _ = _load_states(engine, seeded)
        os.environ.update(_dagster_env(url))
        home = os.environ["DAGSTER_HOME"]
        if serve:
            return _serve(seeded, before)

        print(
            f"seeded {len(seeded)} jobs stuck in processing for 6 minutes to 10 hours; reconciling them "
            "through the\nsensor and its runs ...\n"
        )
        # Import after the environment points at the sandbox: resources read it at wiring time.
        import dagster as dg

        from recon_dagster.definitions import build_defs

        with dg.DagsterInstance.get() as instance, _quiet_console(verbose):
            report = reconcile_once(build_defs(), instance=instance)
        after, workflow = _load_states(engine, seeded)
        print_table(seeded, before, after, workflow)
        # Two lines: one row per provider family makes the counts two digits wide.
        print(f"\n{_counts(seeded, after)}\n({report.runs} Dagster runs, {report.failed_runs} failed)")
        if report.summary.scanned > len(seeded):
            print(
                f"(the database held {report.summary.scanned - len(seeded)} more stuck jobs; reconciled too)"
            )
        _print_credits(engine, DEMO_USER)
        print(f"media stored in: {settings().media_dir}\nDagster home: {home}")
        print(
            "\nNext: `recon-dagster demo --serve` replays this incident in the Dagster UI\n"
            "(http://127.0.0.1:3000): every run, its per-job log and the sensor's ticks."
        )
        return 0 if report.failed_runs == 0 else 1


def _serve(seeded: list[tuple[DemoJob, uuid.UUID]], before: dict[str, RowState]) -> int:
    """Start ``dagster dev`` on the seeded rows: its daemon's sensor reconciles them, so the runs,
    their logs and the ticks are in the UI's history (the sandbox stays up meanwhile)."""
    print_table(seeded, before, None, None)
    print(
        f"\nseeded {len(seeded)} stuck jobs; starting `dagster dev` (Ctrl-C to stop): its daemon's sensor "
        "picks them up within a few seconds. Open http://127.0.0.1:3000/runs"
    )
    env = dict(os.environ)
    env.setdefault(Settings.sensor_interval_s.name, "5")
    # the demo ticks faster unless told otherwise
    try:
        # The workspace file names the location recon_dagster (``-m`` would name it after the module).
        # Stopped whole on SIGTERM / SIGINT: no webserver or daemon left behind.
        rc = run_process_tree(dagster_dev_argv(Path(os.environ["DAGSTER_HOME"])), env=env)
    except KeyboardInterrupt:
        return 0
    return 0 if rc in (128 + signal.SIGINT, 128 + signal.SIGTERM) else rc


def _num(value: object) -> str:
    """A credit amount without trailing zeros (12.0000 -> 12)."""
    return f"{float(str(value)):g}"


def _print_credits(engine: sa.Engine, user: uuid.UUID) -> None:
    with engine.connect() as conn:
        b = conn.execute(
            sa.text("SELECT subscription_credits, topup_credits FROM user_credits WHERE user_id = :u"),
            {"u": str(user)},
        ).one()
    print(
        f"demo user's credits: subscription {_num(b.subscription_credits)}, top-up {_num(b.topup_credits)} "
        "(started at 100 and 100)"
    )
