"""``recon-dagster demo``: the incident that started all this, reconciled end to end.

Starts (or reuses) the configured PostgreSQL (embedded by default) and the loopback provider
sandbox, seeds the stuck KIE nano-banana-pro 2K image job (processing at 92% for 10 hours, its
upstream task long finished) next to one stuck row of every other provider family, then runs one
``reconcile --once`` through the real sensor and jobs, and prints what happened to each row.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from recon_dagster.db import credits
from recon_dagster.db.engine import get_engine, redact, resolve_database_url
from recon_dagster.db.migrate import migrate
from recon_dagster.instance import dagster_dev_argv, prepare_dagster_home


@dataclass(frozen=True)
class DemoJob:
    label: str
    kind: str | None
    job_type: str
    minutes_stuck: float
    scenario: dict | None  # sandbox Scenario fields; None: no upstream task (sync / legacy)
    progress: int = 50
    cost: int = 10


DEMO_JOBS: tuple[DemoJob, ...] = (
    DemoJob(
        "THE INCIDENT: nano-banana-pro 2K image",
        "kie-standard",
        "image",
        600,
        {"polls_before_done": 0},
        92,
        12,
    ),
    DemoJob("Veo video", "kie-veo", "video", 40, {"polls_before_done": 0}),
    DemoJob("Suno song", "kie-suno", "audio", 45, {"polls_before_done": 0}),
    DemoJob(
        "Flux Kontext edit (upstream failed)",
        "kie-kontext",
        "image",
        15,
        {"outcome": "fail", "polls_before_done": 0},
    ),
    DemoJob(
        "Luma modify (callback failed, generation ok)",
        "kie-luma",
        "video",
        30,
        {"polls_before_done": 0, "luma_callback_failed": True},
    ),
    DemoJob("Kling 3.0 video (still generating)", "kie-kling3", "video", 30, {"outcome": "run_forever"}),
    DemoJob(
        "Runway video (result expired upstream)",
        "kie-runway",
        "video",
        30,
        {"polls_before_done": 0, "expired": True},
    ),
    DemoJob("Lip-sync video", "kie-lip-sync", "video", 80, {"polls_before_done": 0}),
    DemoJob("KIE-proxied LLM (sync)", "kie-llm", "text", 6, None),
    DemoJob("Replicate prediction", "replicate-prediction", "image", 25, {"polls_before_done": 0}),
    DemoJob("Replicate LoRA training", "replicate-training", "lora-training", 35, {"polls_before_done": 0}),
    DemoJob("ElevenLabs dubbing", "elevenlabs-async", "audio", 20, {"polls_before_done": 0}),
    DemoJob("ElevenLabs TTS (sync)", "elevenlabs-sync", "audio", 6, None),
    DemoJob("Anthropic ai-writer (sync)", "anthropic-sync", "text", 6, None),
    DemoJob("Legacy row from before Phase 1", None, "image", 8, None),
)


def _seed(engine: sa.Engine, sandbox) -> tuple[uuid.UUID, list[tuple[DemoJob, uuid.UUID]]]:  # noqa: ANN001
    from recon_dagster.sandbox import Scenario

    user = uuid.uuid4()
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


def run_demo(*, serve: bool = False, port: int = 0) -> int:
    from recon_dagster.once import reconcile_once
    from recon_dagster.sandbox import SandboxServer

    url = resolve_database_url()
    engine = get_engine(url)
    applied = migrate(engine)
    print(f"database: {redact(url)} (migrations applied now: {len(applied)})")
    os.environ.setdefault("RECON_MEDIA_DIR", str(Path.cwd() / ".recon" / "media"))

    with SandboxServer(port=port) as sandbox:
        os.environ.update(sandbox.env())
        print(f"provider sandbox: {sandbox.base_url}")
        user, seeded = _seed(engine, sandbox)
        print(f"seeded {len(seeded)} stuck jobs for demo user {user}\n")

        # Import after the environment points at the sandbox: resources read it at wiring time.
        import dagster as dg

        from recon_dagster.definitions import build_defs

        os.environ.update(_dagster_env(url))
        home = os.environ["DAGSTER_HOME"]
        with dg.DagsterInstance.get() as instance:
            report = reconcile_once(build_defs(), instance=instance)
        print(report.line())
        print()
        _print_rows(engine, seeded)
        _print_credits(engine, user)
        print(f"\nmedia stored under {os.environ['RECON_MEDIA_DIR']}; Dagster home {home}")
        if not serve:
            print(
                "\nSee it in the Dagster UI: `recon-dagster demo --serve` (keeps the sandbox up and runs "
                "`dagster dev` on this code location)."
            )
            return 0 if report.failed_runs == 0 else 1
        print("\nstarting `dagster dev` (Ctrl-C to stop) ...")
        try:
            return subprocess.call(
                dagster_dev_argv(Path(home)),
                env=dict(os.environ),
            )
        except KeyboardInterrupt:
            return 0


def _print_rows(engine: sa.Engine, seeded: list[tuple[DemoJob, uuid.UUID]]) -> None:
    ids = [str(j) for _, j in seeded]
    with engine.connect() as conn:
        rows = {
            str(r.id): r
            for r in conn.execute(
                sa.text(
                    "SELECT j.id, j.status, j.progress, j.reconcile_attempts, j.error_message, "
                    "(SELECT status FROM usage_logs u WHERE u.job_id = j.id LIMIT 1) AS credits, "
                    "(SELECT count(*) FROM assets a WHERE a.job_id = j.id) AS assets "
                    "FROM jobs j WHERE j.id = ANY(CAST(:ids AS uuid[]))"
                ),
                {"ids": ids},
            )
        }
        wf = conn.execute(
            sa.text(
                "SELECT w.status FROM workflow_executions w JOIN jobs j ON j.workflow_execution_id = w.id "
                "WHERE j.id = ANY(CAST(:ids AS uuid[])) LIMIT 1"
            ),
            {"ids": ids},
        ).scalar()
    print(f"{'job':<48} {'provider_kind':<21} {'status':<10} {'credits':<9} {'assets':>6}  note")
    print("-" * 130)
    for job, job_id in seeded:
        r = rows[str(job_id)]
        note = (r.error_message or "")[:60]
        if r.status == "processing":
            note = f"attempt {r.reconcile_attempts}; retried at the next cadence"
        print(
            f"{job.label[:48]:<48} {job.kind or '(none)':<21} {r.status:<10} {r.credits:<9} {r.assets:>6}  {note}"
        )
    print(f"\nworkflow execution of the incident's node: {wf}")


def _print_credits(engine: sa.Engine, user: uuid.UUID) -> None:
    with engine.connect() as conn:
        b = conn.execute(
            sa.text("SELECT subscription_credits, topup_credits FROM user_credits WHERE user_id = :u"),
            {"u": str(user)},
        ).one()
    print(
        f"demo user's credits now: subscription {b.subscription_credits}, top-up {b.topup_credits} (started 100 / 100)"
    )
