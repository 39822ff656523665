"""Provider health judged on what each provider answers now (``recon_dagster.operator.health``):

1. healthy / DEGRADED / DOWN by documented thresholds (a property over every count), a degraded
   provider's check failing at WARN severity, a down one's at ERROR;
2. a job that ended (force-failed, recovered, cancelled) is judged only by an answer it got: its
   unanswered polls are history, never evidence that the provider is down now;
3. slow (the answered polls' latency, the oldest job in flight) is shown per provider, never down.
"""

from __future__ import annotations

import uuid

import hypothesis.strategies as st
import pytest
import sqlalchemy as sa
from hypothesis import given

from recon_dagster.operator.health import HealthPolicy, ProviderFigures, State, judge, verdicts
from recon_dagster.providers.resource import api_key_env_vars
from recon_dagster_tests.support.factories import make_job, make_user

POLICY = HealthPolicy(window_s=1800, min_jobs=3, down_share=0.5, degraded_min_jobs=2, degraded_share=0.2)


@given(
    jobs=st.integers(1, 60),
    data=st.data(),
    min_jobs=st.integers(1, 6),
    degraded_min=st.integers(1, 6),
    down_share=st.sampled_from([0.3, 0.5, 0.75]),
    degraded_share=st.sampled_from([0.05, 0.2, 0.3]),
)
def test_the_state_follows_the_documented_thresholds(
    jobs, data, min_jobs, degraded_min, down_share, degraded_share
):
    unanswered = data.draw(st.integers(0, jobs))
    policy = HealthPolicy(1800, min_jobs, down_share, degraded_min, degraded_share)
    v = judge(ProviderFigures("replicate", jobs=jobs, unanswered=unanswered), policy)
    down = unanswered >= min_jobs and unanswered > down_share * jobs
    degraded = not down and unanswered >= degraded_min and unanswered >= degraded_share * jobs
    expected = State.DOWN if down else State.DEGRADED if degraded else State.HEALTHY
    assert v.state is expected
    assert v.line.startswith(
        f"replicate {expected.value.upper() if expected is not State.HEALTHY else 'healthy'}:"
    )
    assert v.passed is (expected is State.HEALTHY)


def test_four_of_fifteen_jobs_without_answer_is_degraded_not_healthy():
    v = judge(ProviderFigures("replicate", jobs=15, unanswered=4, last_reason="HTTP 503"), POLICY)
    assert v.state is State.DEGRADED
    assert v.line.startswith("replicate DEGRADED: 4 of 15 job(s) got no answer (27%)"), v.line
    assert "last: HTTP 503" in v.line


@pytest.fixture(autouse=True)
def _every_provider_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider without its key reads "not configured" whatever its answers: these tests judge
    configured providers."""
    for env in api_key_env_vars():
        monkeypatch.setenv(env, "k")


def _job(db: sa.Engine, kind: str, status: str = "processing") -> uuid.UUID:
    user = make_user(db)
    return make_job(db, user, status=status, provider_kind=kind, provider_task_id=f"t-{uuid.uuid4().hex[:8]}")


def _poll(
    db: sa.Engine, job: uuid.UUID, kind: str, *, answered: bool, ago_s: float = 60, duration_ms: int = 200
) -> None:
    with db.begin() as conn:
        conn.execute(
            sa.text(
                """
                INSERT INTO reconcile_events (job_id, provider_kind, attempt, outcome, detail, cause,
                                              duration_ms, created_at)
                VALUES (:j, :k, 1, :o, :d, :c, :ms, now() - make_interval(secs => :ago))
                """
            ),
            {
                "j": str(job),
                "k": kind,
                "o": "still_running" if answered else "error",
                "d": "upstream still running" if answered else "HTTP 503 from replicate",
                "c": "answered" if answered else "provider",
                "ms": duration_ms,
                "ago": ago_s,
            },
        )


def _verdict(db: sa.Engine, provider: str):
    with db.connect() as conn:
        return next(v for v in verdicts(conn, POLICY) if v.provider == provider)


def test_jobs_that_ended_are_never_evidence_that_the_provider_is_down_now(db):
    # Four jobs whose last poll got no answer were force-failed since; two jobs in flight answer.
    for _ in range(4):
        _poll(db, _job(db, "replicate-prediction", status="failed"), "replicate-prediction", answered=False)
    for _ in range(2):
        _poll(db, _job(db, "replicate-prediction"), "replicate-prediction", answered=True)

    v = _verdict(db, "replicate")
    assert v.state is State.HEALTHY, v.line
    assert v.line.startswith("replicate healthy: 0 of 2 job(s) got no answer"), v.line


def test_a_provider_with_no_job_in_flight_is_idle_whatever_its_ended_jobs_did_not_get(db):
    for _ in range(4):
        _poll(db, _job(db, "replicate-prediction", status="failed"), "replicate-prediction", answered=False)
    assert _verdict(db, "replicate").state is State.IDLE


def test_a_job_that_ended_by_an_answer_still_says_the_provider_answers(db):
    # After the recovery: 4 force-failed without an answer, 2 completed on an answer, none in flight.
    for _ in range(4):
        _poll(db, _job(db, "replicate-prediction", status="failed"), "replicate-prediction", answered=False)
    for _ in range(2):
        _poll(db, _job(db, "replicate-prediction", status="completed"), "replicate-prediction", answered=True)
    v = _verdict(db, "replicate")
    assert v.state is State.HEALTHY and v.line.startswith("replicate healthy: 0 of 2 job(s)"), v.line


def test_a_degraded_provider_reads_degraded_from_its_jobs_in_flight(db):
    for _ in range(4):
        _poll(db, _job(db, "replicate-prediction"), "replicate-prediction", answered=False)
    for _ in range(11):
        _poll(db, _job(db, "replicate-prediction"), "replicate-prediction", answered=True)
    v = _verdict(db, "replicate")
    assert v.state is State.DEGRADED, v.line


def test_slow_is_shown_per_provider_and_never_down(db):
    # fal answers every poll, slowly (12 s), its jobs in flight for a while; replicate answers fast.
    for _ in range(5):
        job = _job(db, "fal-image")
        for ago in (600, 300, 60):
            _poll(db, job, "fal-image", answered=True, ago_s=ago, duration_ms=12_000)
    _poll(db, _job(db, "replicate-prediction"), "replicate-prediction", answered=True, duration_ms=150)

    fal = _verdict(db, "fal")
    assert fal.state is State.HEALTHY and fal.passed
    assert fal.figures.slow_poll_ms == 12_000
    assert "slow: answers take 12 s" in fal.line, fal.line
    replicate = _verdict(db, "replicate")
    assert "slow" not in replicate.line, replicate.line
