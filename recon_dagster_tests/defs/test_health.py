"""Provider health, run verdicts and failure reasons, through real reconcile runs (sandbox over
HTTP, PostgreSQL, a Dagster instance):

1. a provider is judged by its answers over distinct jobs: a job's own bad result never makes it
   look down, an outage turns that provider red within two ticks and no other, and a provider
   nobody polled is idle (unevaluated), not green;
2. a run whose only job had its own bad result is not failed (no outage), a run that refunded at
   the cap carries a visible ``recon/outcome`` tag;
3. the reason says what came back, the same words in the run's log, ``explain``, ``stuck_jobs``
   (whole, never cut in a word) and the ``reconcile_exhausted`` anomaly.
"""

from __future__ import annotations

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.core.kinds import MAX_ATTEMPTS, provider_names
from recon_dagster.defs.observe.stuck import stuck_rows
from recon_dagster.operator.explain import explain, facts
from recon_dagster.sandbox import Scenario
from recon_dagster_tests.support.factories import job_row
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick

TEXT_INSTEAD_OF_IMAGE = (
    'upstream succeeded with no media, only a JSON object of 31 bytes: {"text": "sandbox text result"}, '
    "where an image was promised"
)
# (kind, job type, scenario) of a job whose own result is bad, per provider.
BAD_RESULTS = {
    "kie-text-result": ("kie-standard", "image", Scenario(polls_before_done=0, media_kind="text")),
    "kie-unreadable-answer": (
        "kie-standard",
        "image",
        Scenario(polls_before_done=0, malformed=True, malformed_kind="unknown_state"),
    ),
    "replicate-text-result": (
        "replicate-prediction",
        "image",
        Scenario(polls_before_done=0, media_kind="text"),
    ),
    "kie-veo-media-gone": ("kie-veo", "video", Scenario(polls_before_done=0, media_status=500)),
}


def _evaluations(instance: dg.DagsterInstance) -> list[tuple[str, bool, str]]:
    """Every provider_health check evaluation so far: (provider, passed, description)."""
    out = []
    for run in instance.get_runs():
        for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
            ev = e.dagster_event.event_specific_data
            if ev.asset_key == dg.AssetKey("provider_health"):
                out.append((ev.check_name, ev.passed, ev.description or ""))
    return out


def _due_again(db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET reconcile_next_at = now() WHERE status IN ('pending', 'processing')")
        )


@pytest.mark.parametrize("bad", sorted(BAD_RESULTS))
def test_jobs_with_their_own_bad_result_never_make_their_provider_look_down(
    db, instance, media_dir, sandbox, bad
):
    kind, job_type, scenario = BAD_RESULTS[bad]
    bad_jobs = [stale_job_with_task(db, sandbox, kind, scenario, job_type=job_type)[1] for _ in range(3)]
    for _ in range(3):  # healthy traffic of the same provider, answered "running"
        stale_job_with_task(db, sandbox, kind, Scenario(outcome="run_forever"), job_type=job_type)
    defs = make_defs(media_dir, cadence_seconds=0, single_run_below=2)

    for _ in range(4):  # the bad jobs error at every pass
        tick(defs, instance)
        _due_again(db)

    provider = kind.split("-")[0]
    judged = [(passed, line) for p, passed, line in _evaluations(instance) if p == provider]
    assert judged and all(passed for passed, _ in judged), judged
    assert judged[-1][1].startswith(f"{provider} healthy: 0 of 3 job(s) got no answer (0%)"), judged[-1][1]
    assert "3 job(s) failed by their own result, not counted" in judged[-1][1], judged[-1][1]
    # ... and not one of their runs failed: a job's own result is never an outage.
    assert instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])) == []
    assert all(job_row(db, j)["reconcile_attempts"] == 4 for j in bad_jobs)


def test_bad_results_alone_leave_the_provider_idle_not_down(db, instance, media_dir, sandbox):
    for _ in range(4):
        stale_job_with_task(db, sandbox, "kie-standard", Scenario(polls_before_done=0, media_kind="text"))
    defs = make_defs(media_dir, cadence_seconds=0, single_run_below=2)
    tick(defs, instance)
    _due_again(db)
    tick(defs, instance)

    assert [e for e in _evaluations(instance) if e[0] == "kie"] == []  # idle: never evaluated
    result = defs.resolve_job_def("provider_health_job").execute_in_process(instance=instance)
    meta = result.asset_materializations_for_node("provider_health")[0].metadata
    assert meta["idle"].value == ", ".join(provider_names())
    assert meta["down"].value == "none"
    checks = [
        e.event_specific_data.check_name
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    ]
    assert checks == []  # every check skipped: no provider was polled in the window


@pytest.mark.parametrize(
    ("down", "down_kind", "job_type"),
    [
        ("elevenlabs", "elevenlabs-async", "audio"),
        ("replicate", "replicate-prediction", "image"),
        ("kie", "kie-veo", "video"),
    ],
)
def test_an_outage_turns_that_provider_red_within_two_ticks_and_no_other(
    db, instance, media_dir, sandbox, down, down_kind, job_type
):
    for _ in range(4):
        stale_job_with_task(
            db,
            sandbox,
            down_kind,
            Scenario(server_error_first=1000, outcome="run_forever"),
            job_type=job_type,
        )
    healthy = {
        "elevenlabs": ("elevenlabs-async", "audio"),
        "replicate": ("replicate-prediction", "image"),
        "kie": ("kie-standard", "image"),
    }
    for provider, (kind, jt) in healthy.items():
        if provider != down:
            for _ in range(2):
                stale_job_with_task(db, sandbox, kind, Scenario(outcome="run_forever"), job_type=jt)
    defs = make_defs(media_dir, cadence_seconds=0, single_run_below=2)

    red_at = None
    for n in (1, 2):
        tick(defs, instance)
        _due_again(db)
        if any(p == down and not passed for p, passed, _ in _evaluations(instance)):
            red_at = n
            break

    assert red_at is not None, _evaluations(instance)
    last = {p: (passed, line) for p, passed, line in _evaluations(instance)}
    assert last[down][0] is False and last[down][1].startswith(f"{down} DOWN: 4 of 4 job(s) got no answer")
    assert "HTTP 5" in last[down][1]  # the last reason: what the provider answered
    for provider in healthy:
        if provider != down:
            assert last[provider][0] is True, last
    assert "anthropic" not in last  # idle: no job of it was polled
    failed = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
    assert failed and {r.tags["recon/provider"] for r in failed} == {down}
    assert {r.tags["recon/outcome"] for r in failed} == {"provider_outage"}


def test_the_reason_of_a_bad_result_is_whole_in_the_log_explain_stuck_jobs_and_the_anomaly(
    db, instance, media_dir, sandbox
):
    _, job, _ = stale_job_with_task(
        db,
        sandbox,
        "kie-standard",
        Scenario(polls_before_done=0, media_kind="text"),
        attempts=MAX_ATTEMPTS - 2,
    )
    defs = make_defs(media_dir, cadence_seconds=0)

    tick(defs, instance)  # attempt 17: counted, the job stays in flight
    [first] = instance.get_runs(filters=dg.RunsFilter(job_name="reconcile_job"))
    assert first.status == dg.DagsterRunStatus.SUCCESS and first.tags["recon/outcome"] == "job_errors"
    reason = f"unusable result: {TEXT_INSTEAD_OF_IMAGE}; not completed, nothing charged"
    log = "\n".join(e.user_message for e in instance.all_logs(first.run_id))
    assert f"attempt {MAX_ATTEMPTS - 1}: error - {reason}" in log
    story = dict(facts(explain(db, instance, job)))
    assert story["upstream said last"] == reason
    with db.connect() as conn:
        [row] = [r for r in stuck_rows(conn) if r["job_id"] == str(job)]
    assert row["last_upstream"] == reason  # whole: not cut in the middle of a word

    _due_again(db)
    tick(defs, instance)  # attempt 18: force-failed and refunded at the cap
    second = next(
        r
        for r in instance.get_runs(filters=dg.RunsFilter(job_name="reconcile_job"))
        if r.run_id != first.run_id
    )
    # Money moved at the cap: the run did its work (green), but says so on its row.
    assert second.status == dg.DagsterRunStatus.SUCCESS and second.tags["recon/outcome"] == "refunded_at_cap"
    assert job_row(db, job)["status"] == "failed"
    with db.connect() as conn:
        details = conn.execute(
            sa.text(
                "SELECT details FROM credit_anomalies WHERE job_id = :j AND reason = 'reconcile_exhausted'"
            ),
            {"j": str(job)},
        ).scalar_one()
    assert details["last_error"] == reason
    assert reason in job_row(db, job)["error_message"]


def test_a_long_reason_is_cut_at_a_word_in_stuck_jobs(db, sandbox):
    _, job, _ = stale_job_with_task(db, sandbox, "kie-standard", attempts=3)
    long = "unusable result: " + " ".join(f"word{i}" for i in range(200))
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET reconcile_last_error = :e WHERE id = :j"), {"e": long, "j": str(job)}
        )
    with db.connect() as conn:
        [row] = [r for r in stuck_rows(conn) if r["job_id"] == str(job)]
    shown = row["last_upstream"]
    assert shown.endswith("…") and len(shown) <= 400
    assert long.startswith(shown[:-1]) and long[len(shown) - 1] == " "  # cut between two words


@pytest.mark.parametrize("value", ["infinity", "-infinity", "10000-01-01 00:00:00+00"])
def test_a_time_python_cannot_hold_never_stops_stuck_jobs(db, sandbox, value):
    # A row some other writer left with a lease and a next attempt at infinity (or past year
    # 9999): the table still lists every stuck job, that one with the time as PostgreSQL writes it.
    _, odd, _ = stale_job_with_task(db, sandbox, "kie-standard", attempts=2)
    _, plain, _ = stale_job_with_task(db, sandbox, "kie-veo", attempts=1)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET reconcile_next_at = CAST(:v AS timestamptz), reconcile_lease_owner = 'other', "
                "reconcile_lease_expires_at = CAST(:v AS timestamptz) WHERE id = :j"
            ),
            {"v": value, "j": str(odd)},
        )
    with db.connect() as conn:
        rows = {r["job_id"]: r for r in stuck_rows(conn)}
    assert str(plain) in rows
    shown = rows[str(odd)]
    if value.startswith("-"):
        assert shown["lease"] == "-"  # expired long ago: nobody holds it
    else:
        assert shown["lease"].startswith("other until ") and shown["lease"] != "other until now"
    assert shown["next_attempt"] not in ("now", "")
