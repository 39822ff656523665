"""The money rules on real PostgreSQL, through ``reconcile --once`` (sensor, reconcile runs and the
sweep) and the loopback provider sandbox: a job that never reached its provider call is not stuck;
legacy LoRA trainings are adopted, never swept; a watermarked job never exposes its clean original;
a sole cause means a sole cause; the leak check reads open reservations only, and the legacy cron
is retired only on a full clean cohort."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.core import kinds
from recon_dagster.db.jobs import inflight_counts, scan_stale
from recon_dagster.definitions import build_defs
from recon_dagster.defs.observe import backlog as assets
from recon_dagster.defs.resources import ReconcileSettingsResource
from recon_dagster.media.store import S3MediaStore
from recon_dagster.providers import ProvidersResource, UpstreamStatus, providers_from_env
from recon_dagster.reconcile import app_worker as worker
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.factories import (
    balances,
    job_row,
    make_job,
    make_user,
    make_workflow,
    reserve,
)
from recon_dagster_tests.support.ledger import anomaly_reasons
from recon_dagster_tests.support.plans import index_of, plan_nodes
from recon_dagster_tests.support.reconcile import make_defs, one, stale_job_id, tick, usage_status
from recon_dagster_tests.support.s3 import BUCKET, s3_resource

D = Decimal
PRECALL_BUDGET_ENV = "RECON_PRECALL_BUDGET_S"


def set_started_at(db: sa.Engine, job_id: uuid.UUID, minutes_ago: float) -> None:
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET started_at = now() - make_interval(secs => :s) WHERE id = :id"),
            {"s": minutes_ago * 60, "id": str(job_id)},
        )


# ---------------------------------------------------------------------------------------------
# A job that has not reached its provider call is not stuck
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("minutes", [10, 40, 170])
def test_a_job_that_has_not_reached_its_provider_call_is_not_stuck(db, instance, media_dir, sandbox, minutes):
    user = make_user(db, sub=100, topup=50)
    legacy = make_job(db, user, created_minutes_ago=minutes)  # pre-135 shape: no kind at all
    queued = make_job(db, user, status="pending", provider_kind="kie-standard", created_minutes_ago=minutes)
    dequeued = make_job(db, user, provider_kind="anthropic-sync", created_minutes_ago=minutes + 60)
    set_started_at(db, dequeued, minutes)  # picked up by a worker, still in pre-call work
    for job in (legacy, queued, dequeued):
        reserve(db, job, user, 10, from_sub=10, from_topup=0)

    report = tick(make_defs(media_dir), instance, sweep=True)

    assert report.failed_runs == 0
    for job in (legacy, queued, dequeued):
        assert job_row(db, job)["status"] in ("pending", "processing")
        assert usage_status(db, job) == "reserved"
    assert balances(db, user) == (D(70), D(50))
    with db.connect() as conn:
        assert sum(r["stale"] for r in inflight_counts(conn)) == 0


def test_past_the_precall_budget_such_a_row_is_swept_and_refunded(db, instance, media_dir, sandbox):
    user = make_user(db, sub=100, topup=50)
    old = make_job(db, user, provider_kind="kie-standard", created_minutes_ago=181)
    young = make_job(db, user, provider_kind="kie-standard", created_minutes_ago=179)
    reserve(db, old, user, 10, from_sub=10, from_topup=0)
    reserve(db, young, user, 10, from_sub=10, from_topup=0)

    tick(make_defs(media_dir), instance, sweep=True)

    assert (job_row(db, old)["status"], usage_status(db, old)) == ("failed", "refunded")
    assert (job_row(db, young)["status"], usage_status(db, young)) == ("processing", "reserved")
    assert balances(db, user) == (D(90), D(50))


def test_the_precall_budget_is_configurable(db, monkeypatch):
    user = make_user(db)
    forty = make_job(db, user, created_minutes_ago=40)
    make_job(db, user, created_minutes_ago=5)
    monkeypatch.setenv(PRECALL_BUDGET_ENV, "1200")

    with db.connect() as conn:
        assert [r.id for r in scan_stale(conn, 50)] == [forty]


@pytest.mark.parametrize("raw", ["abc", "0", "-60", "nan", "inf", "3h"])
def test_a_bad_precall_budget_is_a_clear_error(monkeypatch, raw):
    monkeypatch.setenv(PRECALL_BUDGET_ENV, raw)
    with pytest.raises(ValueError, match=f"{PRECALL_BUDGET_ENV} must be a positive number of seconds"):
        kinds.precall_budget()


@pytest.fixture
def providers(sandbox: SandboxServer) -> Iterator[ProvidersResource]:
    sandbox.reset()
    res = providers_from_env()
    yield res
    res.close()


def _kie_run(providers: ProvidersResource):
    payload = {"model": "flux-test", "input": {"prompt": "x"}}
    return lambda cb: providers.run("kie-standard", payload, on_task_created=cb, poll_interval_s=0.01)


@pytest.mark.parametrize("status", ["failed", "cancelled", "completed"])
def test_run_or_resume_never_starts_upstream_work_for_an_ended_job(db, sandbox, providers, status):
    user = make_user(db)
    job = make_job(db, user, status=status)
    before = sandbox.create_count()

    with pytest.raises(worker.JobNoLongerInFlight, match=f"job {job} is {status}"):
        worker.run_or_resume(job, "kie-standard", _kie_run(providers), providers=providers, engine=db)

    assert sandbox.create_count() == before
    assert job_row(db, job)["provider_task_id"] is None


def test_a_task_created_for_a_job_swept_meanwhile_is_refused_and_flagged(db, sandbox, providers):
    """The sweep (or a cancel) ends the row while the worker's create is in flight."""
    user = make_user(db)
    job = make_job(db, user, status="processing")
    persist = worker.make_on_task_created(job, "kie-standard", engine=db)

    def swept_then_created(cb: Any) -> UpstreamStatus:
        with db.begin() as conn:
            conn.execute(sa.text("UPDATE jobs SET status = 'failed' WHERE id = :j"), {"j": str(job)})
        return _kie_run(providers)(cb)

    with pytest.raises(worker.JobNoLongerInFlight):
        swept_then_created(persist)

    row = job_row(db, job)
    assert (row["status"], row["provider_task_id"], row["provider_kind"]) == ("failed", None, None)
    assert row["provider_call_started_at"] is None
    assert anomaly_reasons(db, job) == ["upstream_task_for_ended_job"]


def test_mark_provider_call_start_refuses_an_ended_job(db):
    user = make_user(db)
    job = make_job(db, user, status="cancelled")

    with pytest.raises(worker.JobNoLongerInFlight):
        worker.mark_provider_call_start(job, "anthropic-sync", engine=db)

    assert job_row(db, job)["provider_call_started_at"] is None
    with pytest.raises(worker.JobNotFound):
        worker.mark_provider_call_start(uuid.uuid4(), "anthropic-sync", engine=db)


# ---------------------------------------------------------------------------------------------
# Legacy LoRA trainings are adopted, never swept
# ---------------------------------------------------------------------------------------------


def _legacy_training(db: sa.Engine, sandbox: SandboxServer, scenario: Scenario, minutes: float = 240):
    user = make_user(db, sub=100, topup=0)
    training = sandbox.add_task("replicate-training", scenario)
    job = make_job(db, user, job_type="lora-training", created_minutes_ago=minutes)
    reserve(db, job, user, 40, from_sub=40, from_topup=0)
    with db.begin() as conn:
        character = conn.execute(
            sa.text(
                "INSERT INTO characters (user_id, name, training_status, replicate_training_id, "
                "training_job_id, training_started_at) VALUES (:u, 'c', 'training', :t, :j, "
                "now() - make_interval(secs => :s)) RETURNING id"
            ),
            {"u": str(user), "t": training, "j": str(job), "s": minutes * 60},
        ).scalar_one()
    return user, job, character, training


def test_legacy_lora_trainings_are_adopted_never_swept(db, instance, media_dir, sandbox):
    user, job, character, training = _legacy_training(db, sandbox, Scenario(outcome="run_forever"))
    defs = make_defs(media_dir)

    with db.connect() as conn:
        assert job not in [r.id for r in scan_stale(conn, 50)]
    tick(defs, instance, sweep=True)
    tick(defs, instance, sweep=True)

    row = job_row(db, job)
    assert row["status"] == "processing"
    assert (row["provider_kind"], row["provider_task_id"]) == ("replicate-training", training)
    assert usage_status(db, job) == "reserved"
    assert one(db, "SELECT training_status FROM characters WHERE id = :c", c=character) == "training"
    assert balances(db, user) == (D(60), D(0))


def test_an_adopted_training_replicate_reports_finished_is_settled(db, instance, media_dir, sandbox):
    _, job, character, _ = _legacy_training(db, sandbox, Scenario(polls_before_done=0))
    defs = make_defs(media_dir)

    tick(defs, instance, sweep=True)  # the sweep adopts it
    tick(defs, instance, sweep=True)  # the sensor polls it: Replicate says succeeded

    assert job_row(db, job)["status"] == "completed"
    assert usage_status(db, job) == "committed"
    assert one(db, "SELECT training_status FROM characters WHERE id = :c", c=character) == "ready"


# ---------------------------------------------------------------------------------------------
# A watermarked job never exposes its clean original
# ---------------------------------------------------------------------------------------------


def _stuck_image(db: sa.Engine, sandbox: SandboxServer, should_watermark: bool | None) -> uuid.UUID:
    return stale_job_id(db, sandbox, "kie-standard", should_watermark=should_watermark)


def _references(db: sa.Engine, job: uuid.UUID) -> str:
    """Everything the app, an asset or the audit trail says about a job's media, as one text."""
    with db.connect() as conn:
        parts = [
            json.dumps(job_row(conn, job)["output_data"]),
            json.dumps([dict(r) for r in conn.execute(
                sa.text("SELECT storage_key, url, metadata FROM assets WHERE job_id = :j"), {"j": str(job)}
            ).mappings()]),
            json.dumps(list(conn.execute(
                sa.text("SELECT detail FROM reconcile_events WHERE job_id = :j"), {"j": str(job)}
            ).scalars())),
        ]  # fmt: skip
    return "\n".join(parts)


def _assert_only_watermarked(db: sa.Engine, job: uuid.UUID, stored_keys: list[str]) -> None:
    assert job_row(db, job)["status"] == "completed"
    assert stored_keys, "nothing stored"
    assert all(".watermarked." in k for k in stored_keys), stored_keys
    refs = _references(db, job)
    media = job_row(db, job)["output_data"]["media"]
    assert media and all(".watermarked." in m["key"] for m in media)
    clean = stored_keys[0].replace(".watermarked", "")
    assert clean not in refs
    assert ".watermarked." in one(db, "SELECT storage_key FROM assets WHERE job_id = :j", j=job)


@pytest.mark.parametrize("should_watermark", [True, None], ids=["true", "null-is-free-tier"])
def test_a_watermarked_job_never_exposes_its_clean_original_folder(
    db, instance, media_dir, sandbox, should_watermark
):
    job = _stuck_image(db, sandbox, should_watermark)

    tick(make_defs(media_dir), instance)

    keys = [str(p.relative_to(media_dir)) for p in Path(media_dir).rglob("*") if p.is_file()]
    _assert_only_watermarked(db, job, keys)


def test_unwatermarked_rows_keep_their_original(db, instance, media_dir, sandbox):
    job = _stuck_image(db, sandbox, False)

    tick(make_defs(media_dir), instance)

    keys = [str(p.relative_to(media_dir)) for p in Path(media_dir).rglob("*") if p.is_file()]
    assert len(keys) == 1 and ".watermarked." not in keys[0]
    assert ".watermarked." not in _references(db, job)


@pytest.mark.parametrize("should_watermark", [True, None], ids=["true", "null-is-free-tier"])
def test_a_watermarked_job_never_exposes_its_clean_original_s3(
    db,
    instance,
    sandbox,
    moto_endpoint,
    should_watermark,
):
    job = _stuck_image(db, sandbox, should_watermark)
    prefix = f"wm-{uuid.uuid4().hex[:8]}/"
    store = S3MediaStore(
        s3=s3_resource(moto_endpoint), bucket=BUCKET, prefix=prefix, public_base_url="https://cdn.example"
    )
    defs = build_defs(
        {
            "providers": providers_from_env(),
            "media_store": store,
            "reconcile_settings": ReconcileSettingsResource(),
        }
    )

    tick(defs, instance)

    listed = store._get_client().list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    keys = [o["Key"][len(prefix) :] for o in listed]
    _assert_only_watermarked(db, job, keys)
    url = one(db, "SELECT url FROM assets WHERE job_id = :j", j=job)
    assert url.startswith("https://cdn.example/") and ".watermarked." in url


# ---------------------------------------------------------------------------------------------
# Sole cause means sole cause
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sibling_status", ["failed", "completed", None])
def test_sole_cause_means_sole_cause(db, instance, media_dir, sandbox, sibling_status):
    user = make_user(db)
    wf = make_workflow(db, user, failed_nodes=["n1"])
    task = sandbox.add_task("kie-standard", Scenario(polls_before_done=0))
    stuck = make_job(
        db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=11,
        workflow_execution_id=wf, node_id="n1",
    )  # fmt: skip
    reserve(db, stuck, user, 5)
    if sibling_status is not None:  # another job of the same node in the same execution
        make_job(db, user, status=sibling_status, workflow_execution_id=wf, node_id="n1")
    make_job(db, user, status="failed", workflow_execution_id=wf, node_id="n2")  # not listed: ignored

    tick(make_defs(media_dir), instance)

    assert job_row(db, stuck)["status"] == "completed"
    expected = "failed" if sibling_status == "failed" else "completed"
    assert one(db, "SELECT status FROM workflow_executions WHERE id = :w", w=wf) == expected


# ---------------------------------------------------------------------------------------------
# no_credit_leak reads the open reservations only; the LoRA retirement flag needs a cohort
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_no_credit_leak_does_not_scan_all_of_usage_logs(db):
    with db.begin() as conn:
        conn.execute(
            sa.text(
                """
                WITH u AS (SELECT gen_random_uuid() AS id)
                INSERT INTO jobs (id, user_id, job_type, status, updated_at)
                SELECT gen_random_uuid(), (SELECT id FROM u), 'image',
                       CASE WHEN g % 500 = 0 THEN 'processing' ELSE 'completed' END,
                       now() - make_interval(secs => g)
                FROM generate_series(1, 30000) g
                """
            )
        )
        conn.execute(
            sa.text(
                """
                INSERT INTO usage_logs (job_id, user_id, status, amount)
                SELECT id, user_id, CASE WHEN status = 'processing' THEN 'reserved' ELSE 'committed' END, 1
                FROM jobs
                """
            )
        )
        conn.exec_driver_sql("ANALYZE jobs")
        conn.exec_driver_sql("ANALYZE usage_logs")
        raw = conn.execute(
            sa.text("EXPLAIN (FORMAT JSON) " + assets.CREDIT_LEAK_SQL), {"grace": 10}
        ).scalar_one()
    plan = raw if isinstance(raw, list) else json.loads(raw)
    nodes = plan_nodes(plan[0]["Plan"])
    on_logs = [n for n in nodes if n.get("Relation Name") == "usage_logs"]
    assert on_logs
    assert {index_of(n) for n in on_logs} == {"usage_logs_reserved_idx"}, [n["Node Type"] for n in on_logs]
    assert all(n["Node Type"] != "Seq Scan" for n in nodes if n.get("Relation Name") == "jobs")


def _settled_trainings(db: sa.Engine, sandbox: SandboxServer, n: int) -> None:
    """``n`` trainings the new path settled as ready, each one Replicate reports succeeded."""
    user = make_user(db)
    for _ in range(n):
        training = sandbox.add_task("replicate-training", Scenario(polls_before_done=0))
        job = make_job(
            db, user, job_type="lora-training", status="completed",
            provider_kind="replicate-training", provider_task_id=training,
        )  # fmt: skip
        with db.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO characters (user_id, name, training_status, replicate_training_id, "
                    "training_job_id) VALUES (:u, 'c', 'ready', :t, :j)"
                ),
                {"u": str(user), "t": training, "j": str(job)},
            )
            # Reconciliation's own audit trail: only trainings it settled count.
            conn.execute(
                sa.text(
                    "INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome) "
                    "VALUES (:j, 'replicate-training', 1, 'recovered')"
                ),
                {"j": str(job)},
            )


def _retirement(db: sa.Engine, instance: Any, media_dir: str) -> dict[str, Any]:
    result = (
        make_defs(media_dir)
        .resolve_job_def("lora_training_migration_job")
        .execute_in_process(instance=instance)
    )
    [check] = result.get_asset_check_evaluations()
    return {k: v.value for k, v in check.metadata.items()}


@pytest.mark.parametrize(
    ("settled", "orphan", "mismatch", "blocked_by"),
    [
        (19, False, False, "only 19 training(s) compared, 20 needed"),
        (20, True, False, "1 legacy training(s) with no jobs row, which only the legacy cron sees"),
        (20, False, True, "1 training(s) settled differently from the legacy cron"),
        (20, False, False, None),
    ],
)
def test_the_legacy_cron_is_retired_only_on_a_full_clean_cohort(
    db, instance, media_dir, sandbox, settled, orphan, mismatch, blocked_by
):
    sandbox.reset()
    _settled_trainings(db, sandbox, settled)
    if orphan:
        with db.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO characters (user_id, name, training_status, replicate_training_id) "
                    "VALUES (:u, 'orphan', 'training', 'r8-orphan')"
                ),
                {"u": str(uuid.uuid4())},
            )
    if mismatch:
        with db.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE characters SET training_status = 'failed' "
                    "WHERE id = (SELECT id FROM characters WHERE training_status = 'ready' LIMIT 1)"
                )
            )
            conn.execute(sa.text("UPDATE jobs SET status = 'failed' WHERE id = (SELECT training_job_id "
                                 "FROM characters WHERE training_status = 'failed' LIMIT 1)"))  # fmt: skip

    meta = _retirement(db, instance, media_dir)

    assert meta["legacy_cron_can_be_retired"] is (blocked_by is None)
    assert meta["retirement_blocked_by"] == (blocked_by or "nothing")
