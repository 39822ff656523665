"""The create ledger (migration 148) as the worker library writes it, on real PostgreSQL and the
sandbox over HTTP: an intent before the request leaves, the task id the moment it exists, the
end of a create that got no task id."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from recon_dagster.db import ledger
from recon_dagster.providers import AmbiguousCreateError, ProvidersResource, providers_from_env
from recon_dagster.reconcile import app_worker as worker
from recon_dagster.sandbox import SandboxServer, Scenario
from recon_dagster_tests.support.factories import job_row, make_job

KIE_PAYLOAD = {
    "model": "flux-test",
    "input": {"prompt": "a lighthouse"},
    "callBackUrl": "https://app.example/cb?x=1",
}
FAST = 0.01


@pytest.fixture
def providers(sandbox: SandboxServer) -> Iterator[ProvidersResource]:
    """The providers as the worker builds them, on a sandbox with nothing left by an earlier test."""
    sandbox.reset()
    with contextlib.closing(providers_from_env()) as res:
        yield res


def creates(db: sa.Engine, job: uuid.UUID) -> list[ledger.Create]:
    with db.connect() as conn:
        return ledger.creates_of_job(conn, job)


def test_a_create_is_recorded_before_it_is_sent_and_its_task_id_at_once(
    db: sa.Engine, sandbox: SandboxServer, providers: ProvidersResource, user: uuid.UUID
) -> None:
    sandbox.set_default_scenario("kie-standard", Scenario(polls_before_done=1))
    job = make_job(db, user, status="processing")
    recorder = worker.make_on_task_created(job, "kie-standard", engine=db)
    seen: dict[str, Any] = {}
    real_create = providers.kie.create

    def create_spy(kind: str, payload: dict[str, Any]) -> str:
        seen["at_send"] = creates(db, job)
        seen["payload"] = payload
        return real_create(kind, payload)

    object.__setattr__(providers.kie, "create", create_spy)
    status = providers.run("kie-standard", KIE_PAYLOAD, on_task_created=recorder, poll_interval_s=FAST)

    [at_send] = seen["at_send"]
    assert (at_send.state, at_send.task_id, at_send.seq) == ("sending", None, 1)
    assert at_send.marker == f"{job}.1" and at_send.marker_sent
    # The marker rides on the callback URL; the fingerprint is of the request without it.
    assert f"recon_create={job}.1" in seen["payload"]["callBackUrl"]
    assert at_send.fingerprint == ledger.fingerprint(KIE_PAYLOAD)
    [done] = creates(db, job)
    assert (done.state, done.task_id, done.id) == ("created", status.task_id, ledger.create_id(job, 1))
    assert job_row(db, job)["provider_task_id"] == status.task_id


@pytest.mark.parametrize(
    ("error", "state"),
    [(AmbiguousCreateError("answer lost"), "ambiguous"), (ValueError("bad payload"), "refused")],
    ids=["ambiguous", "refused"],
)
def test_a_create_that_raised_is_recorded_as_what_it_was(
    db: sa.Engine, providers: ProvidersResource, user: uuid.UUID, error: Exception, state: str
) -> None:
    job = make_job(db, user, status="processing")
    recorder = worker.make_on_task_created(job, "kie-standard", engine=db)

    def failing_create(kind: str, payload: dict[str, Any]) -> str:
        raise error

    object.__setattr__(providers.kie, "create", failing_create)
    with pytest.raises(type(error)):
        providers.run("kie-standard", KIE_PAYLOAD, on_task_created=recorder, poll_interval_s=FAST)

    [c] = creates(db, job)
    assert (c.state, c.task_id) == (state, None)
    assert type(error).__name__ in c.detail


def test_a_task_id_reported_twice_is_recorded_once(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, status="processing")
    with db.begin() as conn:
        first = ledger.record_task(conn, job, provider="kie", kind="kie-standard", task_id="t-1")
        again = ledger.record_task(conn, job, provider="kie", kind="kie-standard", task_id="t-1")
        other = ledger.record_task(conn, job, provider="kie", kind="kie-standard", task_id="t-2")

    assert first == again
    assert (first.state, first.seq, other.seq) == ("unrecorded", 1, 2)
    assert [c.task_id for c in creates(db, job)] == ["t-1", "t-2"]


def test_the_ledger_keeps_a_task_id_the_row_refused(db: sa.Engine, user: uuid.UUID) -> None:
    """A late ``on_task_created`` for a job already swept: the row stays as it is, the ledger has the
    task (for the orphan sweep to cancel)."""
    job = make_job(db, user, status="failed")
    recorder = worker.make_on_task_created(job, "kie-standard", engine=db)

    with pytest.raises(worker.JobNoLongerInFlight):
        recorder("late-task")

    assert job_row(db, job)["provider_task_id"] is None
    assert [c.task_id for c in creates(db, job)] == ["late-task"]


def test_fate_is_a_compare_and_set(db: sa.Engine, user: uuid.UUID) -> None:
    job = make_job(db, user, status="processing")
    with db.begin() as conn:
        c = ledger.record_task(conn, job, provider="replicate", kind="replicate-prediction", task_id="p-1")
        assert ledger.set_fate(conn, c.id, ledger.Fate.CANCELLED, {"status": "processing"})
        assert not ledger.set_fate(conn, c.id, ledger.Fate.ADOPTED)
        assert ledger.set_fate(conn, c.id, ledger.Fate.ENDED, replaces=[ledger.Fate.CANCELLED])

    [c] = creates(db, job)
    assert c.fate == "ended"


def test_markers_parse_back_to_their_job() -> None:
    job = uuid.uuid4()
    url = f"https://app.example/hook?recon_create={ledger.marker_for(job, 3)}"
    assert ledger.parse_marker(url) == (job, 3)
    assert ledger.parse_marker("https://app.example/hook") is None
    assert ledger.create_id(job, 3) == ledger.create_id(str(job), 3) != ledger.create_id(job, 4)


def test_the_fingerprint_holds_no_secret_and_ignores_key_order() -> None:
    a = ledger.fingerprint({"input": {"p": 1, "q": 2}, "api_key": "sk-secret"})
    b = ledger.fingerprint({"input": {"q": 2, "p": 1}})
    assert a == b and "sk-secret" not in a


def test_explain_shows_every_create_every_task_id_and_what_became_of_each(
    db: sa.Engine, user: uuid.UUID
) -> None:
    from recon_dagster.operator.explain import load_story, to_json, to_text

    job = make_job(db, user, provider_kind="kie-standard", provider_task_id="t-named", started_minutes_ago=1)
    with db.begin() as conn:
        named = ledger.record_task(conn, job, provider="kie", kind="kie-standard", task_id="t-named")
        orphan = ledger.record_task(conn, job, provider="kie", kind="kie-standard", task_id="t-orphan")
        ledger.set_fate(conn, orphan.id, ledger.Fate.ORPHAN_BILLED)
        lost = ledger.record_intent(
            conn, job, provider="kie", kind="kie-standard", fingerprint="f", marker_sent=True
        )
        ledger.record_outcome(conn, lost.id, ledger.CreateState.AMBIGUOUS, "answer lost")

    story = load_story(db, job)
    text = to_text(story, None)

    assert "3 create(s), 2 task id(s) (more than one" in text
    assert f"#{named.seq} kie-standard" in text and "t-named; the job's task" in text
    assert "t-orphan; orphan_billed" in text
    assert "ambiguous (answer lost), no task id" in text
    assert [c["task_id"] for c in to_json(story, None)["creates"]] == ["t-named", "t-orphan", None]
