"""LoRA-training migration: legacy trainings adopted onto the reconcile path,
recovered by the sensor, and shadow-compared against the legacy cron's decisions."""

from __future__ import annotations

import uuid

import dagster as dg
import sqlalchemy as sa

from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row, make_job, make_user, reserve
from recon_dagster_tests.support.reconcile import make_defs, one, tick


def _legacy_training(db, sandbox, scenario=None, *, character_status="training", job_status="processing"):
    """A training the legacy code started: the id lives only on characters, not on jobs."""
    user = make_user(db)
    training_id = sandbox.add_task("replicate-training", scenario or Scenario(polls_before_done=0))
    job = make_job(db, user, job_type="lora-training", status=job_status, created_minutes_ago=45)
    reserve(db, job, user, 40)
    with db.begin() as conn:
        character = conn.execute(
            sa.text(
                "INSERT INTO characters (user_id, name, training_status, replicate_training_id, training_job_id, "
                "training_started_at) VALUES (:u, 'c', :s, :t, :j, now() - interval '40 minutes') RETURNING id"
            ),
            {"u": str(user), "s": character_status, "t": training_id, "j": str(job)},
        ).scalar_one()
    return job, character, training_id


def _cohort(defs: dg.Definitions, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    result = defs.resolve_job_def("lora_training_migration_job").execute_in_process(instance=instance)
    assert result.success
    return result


def _check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    [evaluation] = result.get_asset_check_evaluations()
    return evaluation


def test_legacy_training_is_adopted_recovered_and_matches_the_legacy_decision(
    db, instance, media_dir, sandbox
):
    job, character, training_id = _legacy_training(db, sandbox)
    defs = make_defs(media_dir)

    _cohort(defs, instance)
    row = job_row(db, job)
    assert (row["provider_kind"], row["provider_task_id"]) == ("replicate-training", training_id)
    assert row["provider_call_started_at"] is not None

    tick(defs, instance)
    assert job_row(db, job)["status"] == "completed"
    assert one(db, "SELECT training_status FROM characters WHERE id = :c", c=character) == "ready"
    assert one(db, "SELECT lora_weights_url FROM characters WHERE id = :c", c=character)

    check = _check(_cohort(defs, instance))
    assert check.passed
    assert check.metadata["compared"].value == 1
    # One matching training is not a cohort (20 compared are needed).
    assert check.metadata["legacy_cron_can_be_retired"].value is False
    assert "only 1 training(s) compared, 20 needed" in check.metadata["retirement_blocked_by"].value


def test_failed_training_fails_the_character_like_the_legacy_cron(db, instance, media_dir, sandbox):
    job, character, _ = _legacy_training(db, sandbox, Scenario(outcome="fail", polls_before_done=0))
    defs = make_defs(media_dir)

    _cohort(defs, instance)
    tick(defs, instance)

    assert job_row(db, job)["status"] == "failed"
    assert one(db, "SELECT training_status FROM characters WHERE id = :c", c=character) == "failed"
    assert _check(_cohort(defs, instance)).passed


def test_shadow_compare_flags_a_character_the_legacy_cron_would_have_made_ready(
    db, instance, media_dir, sandbox
):
    job, character, training_id = _legacy_training(
        db, sandbox, character_status="failed", job_status="failed"
    )
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET provider_kind = 'replicate-training', provider_task_id = :t WHERE id = :j"
            ),
            {"t": training_id, "j": str(job)},
        )
        # Reconciliation's own audit trail says it failed this job (only such jobs are compared).
        conn.execute(
            sa.text(
                "INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome, detail) "
                "VALUES (:j, 'replicate-training', 1, 'failed', 'upstream failed')"
            ),
            {"j": str(job)},
        )

    check = _check(_cohort(make_defs(media_dir), instance))

    assert not check.passed
    assert check.metadata["mismatches"].value == 1
    assert check.metadata["legacy_cron_can_be_retired"].value is False


def test_adoption_never_overwrites_a_task_id_or_touches_settled_jobs(db, instance, media_dir, sandbox):
    job_with_id, _, _ = _legacy_training(db, sandbox)
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET provider_task_id = 'already-set' WHERE id = :j"), {"j": str(job_with_id)}
        )
    done, _, _ = _legacy_training(db, sandbox, job_status="completed")
    orphan_user = make_user(db)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO characters (user_id, name, training_status, replicate_training_id) "
                "VALUES (:u, 'orphan', 'training', 'r8-orphan')"
            ),
            {"u": str(orphan_user)},
        )

    result = _cohort(make_defs(media_dir), instance)

    assert job_row(db, job_with_id)["provider_task_id"] == "already-set"
    assert job_row(db, done)["provider_task_id"] is None
    [mat] = result.asset_materializations_for_node("lora_training_cohort")
    assert mat.metadata["adopted_now"].value == 0
    assert mat.metadata["orphans_without_job_row"].value == 1


def test_health_checks_flag_a_credit_leak(db, instance, media_dir, sandbox):
    user = make_user(db)
    leaked = make_job(db, user, status="completed")
    reserve(db, leaked, user, 5)
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET updated_at = now() - interval '1 hour' WHERE id = :j"),
            {"j": str(leaked)},
        )

    result = (
        make_defs(media_dir).resolve_job_def("reconcile_health_job").execute_in_process(instance=instance)
    )

    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["no_credit_leak"].passed is False
    assert checks["no_credit_leak"].metadata["leaked_jobs"].value == 1
    assert checks["no_stuck_jobs"].passed is True


def test_health_checks_flag_a_job_reconciliation_is_not_reaching(db, instance, media_dir, sandbox):
    user = make_user(db)
    make_job(
        db,
        user,
        provider_kind="kie-standard",
        provider_task_id=str(uuid.uuid4()),
        started_minutes_ago=24 * 60,
    )

    result = (
        make_defs(media_dir).resolve_job_def("reconcile_health_job").execute_in_process(instance=instance)
    )

    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["no_stuck_jobs"].passed is False
    assert checks["no_credit_leak"].passed is True


# --- the cohort is reconciliation's own, and a wrong failure shows ---------


def _training_job(db, sandbox, scenario, *, attempts=0):
    """A training already on the reconcile path (task id on its jobs row), past its threshold."""
    user = make_user(db)
    training_id = sandbox.add_task("replicate-training", scenario)
    job = make_job(
        db,
        user,
        job_type="lora-training",
        provider_kind="replicate-training",
        provider_task_id=training_id,
        started_minutes_ago=45,
        reconcile_attempts=attempts,
    )
    reserve(db, job, user, 40)
    with db.begin() as conn:
        character = conn.execute(
            sa.text(
                "INSERT INTO characters (user_id, name, training_status, replicate_training_id, training_job_id, "
                "training_started_at) VALUES (:u, 'c', 'training', :t, :j, now() - interval '40 minutes') "
                "RETURNING id"
            ),
            {"u": str(user), "t": training_id, "j": str(job)},
        ).scalar_one()
    return job, character, training_id


def test_lora_cohort_counts_only_trainings_reconciliation_settled(db, instance, media_dir, sandbox):
    # Twenty trainings the app's own webhook completed: reconciliation never touched them, so
    # they say nothing about the new path, however well they match the legacy cron.
    from recon_dagster.media.store import LocalMediaStore
    from recon_dagster.providers import providers_from_env
    from recon_dagster.reconcile.finalize import MediaPolicy, ProviderResult, finalize_job_with_media

    providers = providers_from_env()
    store = LocalMediaStore(base_dir=media_dir)
    for _ in range(20):
        job, character, training_id = _training_job(db, sandbox, Scenario(polls_before_done=0))
        result = ProviderResult.from_status(providers.poll("replicate-training", training_id))
        settled = finalize_job_with_media(
            db, store, job, result, source="webhook", policy=MediaPolicy(headers_for=providers.media_headers)
        )
        assert settled.ok and settled.character_updated

    check = _check(_cohort(make_defs(media_dir), instance))

    assert check.metadata["compared"].value == 0
    assert check.metadata["settled_elsewhere"].value == 20
    assert check.metadata["legacy_cron_can_be_retired"].value is False
    blocked = check.metadata["retirement_blocked_by"].value
    assert "only 0 training(s) compared, 20 needed" in blocked
    assert "20 settled training(s) have no reconcile event" in blocked


def test_lora_cohort_counts_a_training_reconciliation_failed(db, instance, media_dir, sandbox):
    # Reconciliation's own failure is in its audit trail too (outcome 'failed'): it is compared.
    job, character, _ = _training_job(db, sandbox, Scenario(outcome="fail", polls_before_done=0))
    defs = make_defs(media_dir)
    tick(defs, instance)
    assert job_row(db, job)["status"] == "failed"

    check = _check(_cohort(defs, instance))

    assert check.passed
    assert (check.metadata["compared"].value, check.metadata["settled_elsewhere"].value) == (1, 0)


def test_lora_shadow_compare_flags_a_failure_while_replicate_still_trains(db, instance, media_dir, sandbox):
    # The attempt cap force-fails a training Replicate still reports running (and cancels it
    # upstream): the legacy cron would have left the character 'training', so this is a
    # mismatch, not "no opinion", though our own cancel ended the training since.
    from recon_dagster.core.kinds import MAX_ATTEMPTS

    job, character, training_id = _training_job(
        db, sandbox, Scenario(outcome="run_forever"), attempts=MAX_ATTEMPTS - 1
    )
    defs = make_defs(media_dir)
    tick(defs, instance)
    assert job_row(db, job)["status"] == "failed"
    assert one(db, "SELECT training_status FROM characters WHERE id = :c", c=character) == "failed"

    check = _check(_cohort(defs, instance))

    assert not check.passed
    assert check.metadata["mismatches"].value == 1
    [sample] = check.metadata["sample"].value
    assert (sample["new"], sample["legacy"]) == ("failed", "training")
    assert (
        sample["training_id"] == training_id
        and "cancelled it upstream when it force-failed" in sample["note"]
    )
    assert sandbox.task_info(training_id)["canceled"] is True
    assert training_id in check.description
    assert "1 training(s) settled differently" in check.metadata["retirement_blocked_by"].value
