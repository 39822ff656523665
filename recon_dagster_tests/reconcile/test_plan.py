"""``recon-dagster plan``: the decisions the next tick would take, per job and per credit, writing nothing."""

from __future__ import annotations

import contextlib
import io
import json
from decimal import Decimal

import pytest

from recon_dagster.cli.commands import main
from recon_dagster.providers import providers_from_env
from recon_dagster.reconcile.plan import build_plan
from recon_dagster.reconcile.reconciler import ReconcileSettings
from recon_dagster_tests.support.world import LIMITER_TABLES, WORLD_DECISIONS, fingerprint, seed_world


def _plan_cli(*args: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--json", *args]) == 0
    return json.loads(out.getvalue())


def _decided(plan_json: dict, jobs: dict) -> dict[str, tuple[str, tuple[str, str, str]]]:
    by_id = {j["job_id"]: j for j in plan_json["jobs"]}
    return {
        name: (
            by_id[str(jid)]["action"],
            tuple(
                format(Decimal(by_id[str(jid)]["money"][k]).normalize(), "f")
                for k in ("commit", "refund_subscription", "refund_topup")
            ),
        )
        for name, jid in jobs.items()
        if str(jid) in by_id
    }


def test_plan_decides_every_situation_and_writes_nothing(db, sandbox, media_dir, monkeypatch) -> None:
    monkeypatch.setenv("RECON_MEDIA_DIR", media_dir)
    jobs = seed_world(db, sandbox)
    before = fingerprint(db, media_dir)
    plan = _plan_cli()
    after = fingerprint(db, media_dir)
    # Polling spends the provider account's shared rate-limit tokens; nothing else moves.
    assert {t: h for t, h in after.items() if t not in LIMITER_TABLES} == {
        t: h for t, h in before.items() if t not in LIMITER_TABLES
    }
    decided = _decided(plan, jobs)
    assert str(jobs["finished"]) not in {j["job_id"] for j in plan["jobs"]}
    assert decided == WORLD_DECISIONS
    totals = plan["totals"]
    assert Decimal(totals["credits"]["commit"]) == 15
    assert Decimal(totals["credits"]["refund_subscription"]) == 1 + 2 + 4 + 2 + 3 + 5
    assert Decimal(totals["credits"]["refund_topup"]) == 2 + 6 + 6
    assert totals["by_action"] == {"complete": 3, "fail": 2, "force_fail": 2, "leave_alone": 4, "sweep": 2}
    assert totals["by_kind"]["kie-kling3"] == {"force_fail": 2, "leave_alone": 1}


def test_plan_without_polling_touches_no_table_at_all(db, sandbox, media_dir) -> None:
    jobs = seed_world(db, sandbox)
    before = fingerprint(db, media_dir)
    decided = _decided(_plan_cli("--no-poll"), jobs)
    assert fingerprint(db, media_dir) == before
    # What the rows alone decide; the rest waits on upstream.
    assert decided["sweep_sync"][0] == decided["sweep_legacy"][0] == "sweep"
    assert decided["takeover_at_cap"][0] == "force_fail"
    assert decided["complete"][0] == decided["running"][0] == "poll"
    assert decided["leased"][0] == "leave_alone"


def test_plan_of_one_kind_and_the_breaker_judges_without_recording(db, sandbox) -> None:
    jobs = seed_world(db, sandbox)
    # A burst of not-found answers of one provider: the plan must see the breaker open as a run would.
    from recon_dagster_tests.support.factories import make_job, make_user

    user = make_user(db)
    lost = [
        make_job(db, user, provider_kind="kie-veo", provider_task_id=f"gone-{i}", started_minutes_ago=60)
        for i in range(8)
    ]
    before = fingerprint(db, skip=LIMITER_TABLES)
    plan = build_plan(db, providers_from_env(), ReconcileSettings(), kind="kie-veo")
    assert fingerprint(db, skip=LIMITER_TABLES) == before
    assert {j.kind for j in plan.jobs} == {"kie-veo"}
    actions = [
        j.action.value for j in plan.jobs if j.job_id in {str(x) for x in [*lost, jobs["fail_not_found"]]}
    ]
    assert actions.count("fail") == 5 and actions.count("count") == 4


def test_plan_rejects_an_unknown_kind_in_one_line(db, capsys) -> None:
    assert main(["plan", "--kind", "kie-nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("recon-dagster plan: unknown provider kind 'kie-nope'; use one of:")
        and "\n" not in err
    )


@pytest.mark.parametrize("fmt", ["text"])
def test_plan_text_has_the_table_and_totals(db, sandbox, capsys, fmt) -> None:
    seed_world(db, sandbox)
    assert main(["plan", "--no-poll"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:6] == ["job", "kind", "age", "attempt", "upstream", "action"]
    assert "credits: commit 0; refund" in out and "  kie-kling3:" in out


def test_plan_reconcile_job_shows_the_table_as_metadata(db, sandbox, media_dir, instance) -> None:
    from recon_dagster_tests.support.reconcile import make_defs

    jobs = seed_world(db, sandbox)
    before = fingerprint(db, media_dir, skip=LIMITER_TABLES)
    result = (
        make_defs(media_dir)
        .resolve_job_def("plan_reconcile")
        .execute_in_process(
            run_config={"ops": {"plan_reconcile_table": {"config": {"kind": "kie-standard"}}}},
            instance=instance,
        )
    )
    assert result.success
    assert fingerprint(db, media_dir, skip=LIMITER_TABLES) == before
    [mat] = [
        e
        for e in result.all_events
        if e.event_type_value == "STEP_OUTPUT" and e.step_key == "plan_reconcile_table"
    ]
    meta = mat.event_specific_data.metadata
    table = meta["plan"].value
    assert f"| {jobs['complete']} | kie-standard |" in table and "| complete |" in table
    assert str(jobs["fail"]) not in table  # another kind
    assert meta["by_action"].value == {"complete": 2, "leave_alone": 2}
