"""A hypothesis state machine over everything that can happen to in-flight jobs, on the real
PostgreSQL database and the loopback provider sandbox, with the invariants checked after every step.

Steps: a job is submitted (credits reserved) with a seeded provider outcome; a worker creates the
upstream task and persists its id, polls it, finalizes or fails it; the user cancels; a webhook
finalizes (``source='webhook'``); a reconcile pass leases the due jobs and works them with the real
``Reconciler``; crashes abandon work midway (an upstream task created but never persisted, a lease
taken and never worked, media stored but never settled, a settle transaction rolled back); the
clock advances (every timestamp shifted back, never a sleep).

Invariants after every step: each reservation is committed or refunded at most once and never
changes afterwards; balances are conserved (pools + reserved + committed = initial); terminal
states are final and settled the right way; every in-flight job is due, leased, waiting its
cadence or not yet stale, and under the attempt cap.

Profiles (``RECON_HYPOTHESIS_PROFILE``): ``ci`` (default, 25 examples x 20 steps) and ``full``
(500 x 50).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from recon_dagster.core.kinds import get_kind, precall_budget
from recon_dagster.db import credits
from recon_dagster.db import jobs as jobs_db
from recon_dagster.media.errors import MediaError
from recon_dagster.media.store import LocalMediaStore
from recon_dagster.providers import providers_from_env
from recon_dagster.providers.status import UpstreamState
from recon_dagster.reconcile import finalize as finalize_module
from recon_dagster.reconcile.app_worker import make_on_task_created
from recon_dagster.reconcile.batches import next_attempt
from recon_dagster.reconcile.finalize import (
    ProviderResult,
    fail_and_refund,
    finalize_job_with_media,
)
from recon_dagster.reconcile.reconciler import Reconciler, ReconcileSettings
from recon_dagster.sandbox import SandboxServer

_COMMON: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}
settings.register_profile("ci", max_examples=25, stateful_step_count=20, **_COMMON)
settings.register_profile("full", max_examples=500, stateful_step_count=50, **_COMMON)
PROFILE = os.environ.get("RECON_HYPOTHESIS_PROFILE", "ci")

KIND = "kie-standard"
START = Decimal("150")
TERMINAL = ("completed", "failed", "cancelled")
SETTINGS = ReconcileSettings(
    max_attempts=4, cadence=timedelta(minutes=5), lease_ttl=timedelta(minutes=15), concurrency=1
)
APP_TABLES = "jobs, usage_logs, user_credits, assets, workflow_executions, credit_anomalies, characters, reconcile_events"

MEDIA_GONE = ("media_expired", "data_removed")  # KIE reports success; the media answers 404/410
OUTCOMES: dict[str, dict[str, Any]] = {
    "succeed_now": {"outcome": "succeed", "polls_before_done": 0},
    "succeed_later": {"outcome": "succeed", "polls_before_done": 2},
    "fail": {"outcome": "fail", "polls_before_done": 1},
    "run_forever": {"outcome": "run_forever"},
    "media_expired": {"outcome": "succeed", "polls_before_done": 0, "media_status": 410},
    "data_removed": {"outcome": "succeed", "polls_before_done": 0, "data_removed": True},
}


@dataclass
class Model:
    job_id: uuid.UUID
    user_id: uuid.UUID
    amount: Decimal
    outcome: str
    terminal: str | None = None
    settled: str | None = None  # committed / refunded, once seen


class _Died(BaseException):
    """The process "died" at a crash point (a BaseException: no ``except Exception`` swallows it)."""


@contextlib.contextmanager
def _die_at(point: str) -> Iterator[None]:
    """Make ``crash_point(point)`` in the finalize module raise ``_Died`` inside this block."""

    def crash_point(name: str) -> None:
        if name == point:
            raise _Died(name)

    saved = finalize_module.crash_point
    finalize_module.crash_point = crash_point
    try:
        yield
    finally:
        finalize_module.crash_point = saved


def make_machine(engine: sa.Engine, media_root: str) -> type[RuleBasedStateMachine]:
    providers = providers_from_env()

    class JobsMachine(RuleBasedStateMachine):
        jobs = Bundle("jobs")

        def __init__(self) -> None:
            super().__init__()
            with engine.begin() as conn:
                conn.exec_driver_sql(f"TRUNCATE {APP_TABLES} RESTART IDENTITY CASCADE")
            self.media_dir = tempfile.mkdtemp(dir=media_root)
            self.store = LocalMediaStore(base_dir=self.media_dir)
            self.reconciler = Reconciler(engine, providers, self.store, settings=SETTINGS)
            self.model: dict[uuid.UUID, Model] = {}
            self.owners = 0

        def teardown(self) -> None:
            shutil.rmtree(self.media_dir, ignore_errors=True)

        # -- helpers ------------------------------------------------------------------------

        def _row(self, job: Model) -> jobs_db.JobRow:
            with engine.connect() as conn:
                row = jobs_db.load_job(conn, job.job_id)
            assert row is not None
            return row

        def _payload(self, job: Model) -> dict[str, Any]:
            return {
                "model": "flux-dev",
                "input": {"prompt": "state machine"},
                "callBackUrl": f"https://app.example/callbacks/{job.job_id}",
                "sandbox_scenario": OUTCOMES[job.outcome],
            }

        def _owner(self) -> str:
            self.owners += 1
            return f"sm-run-{self.owners}"

        # -- the app --------------------------------------------------------------------------

        @rule(
            target=jobs,
            amount=st.integers(min_value=1, max_value=60),
            outcome=st.sampled_from(sorted(OUTCOMES)),
        )
        def submit(self, amount: int, outcome: str) -> Model:
            """The app takes a request: a processing job with its credits reserved."""
            user_id, job_id = uuid.uuid4(), uuid.uuid4()
            with engine.begin() as conn:
                conn.execute(
                    sa.text(
                        "INSERT INTO user_credits (user_id, subscription_credits, topup_credits) VALUES (:u, 100, 50)"
                    ),
                    {"u": str(user_id)},
                )
                conn.execute(
                    sa.text(
                        "INSERT INTO jobs (id, user_id, job_type, status, input_data, started_at) "
                        "VALUES (:id, :u, 'image', 'processing', '{}'::jsonb, now())"
                    ),
                    {"id": str(job_id), "u": str(user_id)},
                )
                credits.reserve_credits_for_job(conn, job_id, user_id, Decimal(amount))
            job = Model(job_id, user_id, Decimal(amount), outcome)
            self.model[job_id] = job
            return job

        @rule(job=jobs, persist=st.booleans())
        def worker_creates_task(self, job: Model, persist: bool) -> None:
            """The worker creates the upstream task and persists its id at once (on_task_created);
            or dies in between (``persist=False``): an orphan task upstream, nothing on the row."""
            row = self._row(job)
            if not row.inflight or row.provider_task_id:
                return
            task_id = providers.create(KIND, self._payload(job))
            if persist:
                make_on_task_created(job.job_id, KIND, engine=engine)(task_id)

        @rule(job=jobs, via=st.sampled_from(["worker", "webhook"]))
        def worker_or_webhook_finishes(self, job: Model, via: str) -> None:
            """Up to three polls (the worker's loop, or the provider's webhook arriving); a
            success is finalized, a failure is failed and refunded by the worker."""
            row = self._row(job)
            if not row.provider_task_id:
                return
            for _ in range(3):
                status = providers.poll(KIND, row.provider_task_id)
                if status.terminal:
                    break
            if status.state is UpstreamState.SUCCEEDED:
                try:
                    finalize_job_with_media(
                        engine, self.store, job.job_id, ProviderResult.from_status(status), source=via
                    )
                except MediaError as exc:  # the media is gone: never completed without it
                    assert job.outcome in MEDIA_GONE, exc
            elif status.terminal and via == "worker":
                fail_and_refund(engine, job.job_id, f"upstream {status.state.value}")

        @rule(job=jobs)
        def user_cancels(self, job: Model) -> None:
            """The app's cancel: the guarded cancel and the refund in one transaction."""
            with engine.begin() as conn:
                if jobs_db.cancel_job(conn, job.job_id):
                    credits.refund_reserved_credits_for_job(conn, job.job_id)

        # -- reconciliation ---------------------------------------------------------------------

        @rule(crash=st.booleans())
        def reconcile_pass(self, crash: bool) -> None:
            """What one sensor tick and its run do: the tick plans every due job (writing nothing),
            the run claims them when it starts, then polls and acts; or the run dies right after
            claiming (``crash=True``)."""
            owner = self._owner()
            with engine.connect() as conn:
                rows = jobs_db.scan_stale(conn, 1000)
            planned = [jobs_db.Claim(r.id, next_attempt(r)) for r in rows]
            work, _settled = self.reconciler.claim(planned, owner)
            if not crash:
                self.reconciler.act(self.reconciler.poll(work), owner)

        @rule(
            job=jobs,
            point=st.sampled_from(["finalize.after_upload", "finalize.in_settle", "refund.in_settle"]),
        )
        def crash_mid_settle(self, job: Model, point: str) -> None:
            """The real finalize (or fail) path dies at one of its crash points: media stored but
            nothing settled, or inside the settle transaction (never COMMITted). In-process the
            death is an exception raised at the point: what PostgreSQL sees is the same, a
            transaction that never commits."""
            row = self._row(job)
            if not row.inflight or not row.provider_task_id:
                return
            status = providers.poll(KIND, row.provider_task_id)
            died = _die_at(point)
            with contextlib.suppress(_Died, MediaError), died:
                if point == "refund.in_settle":
                    fail_and_refund(engine, job.job_id, "worker gave up")
                elif status.state is UpstreamState.SUCCEEDED:
                    finalize_job_with_media(
                        engine, self.store, job.job_id, ProviderResult.from_status(status), source="worker"
                    )

        @rule(minutes=st.sampled_from([1, 4, 6, 11, 16, 60]))
        def clock_advances(self, minutes: int) -> None:
            """Time passes: shift every timestamp the scan, the lease and the cadence read."""
            with engine.begin() as conn:
                conn.execute(
                    sa.text(
                        """
                        UPDATE jobs SET
                          provider_call_started_at = provider_call_started_at - make_interval(mins => :m),
                          started_at = started_at - make_interval(mins => :m),
                          created_at = created_at - make_interval(mins => :m),
                          reconcile_lease_expires_at = reconcile_lease_expires_at - make_interval(mins => :m),
                          reconcile_next_at = reconcile_next_at - make_interval(mins => :m)
                        """
                    ),
                    {"m": minutes},
                )

        # -- invariants ---------------------------------------------------------------------------

        @invariant()
        def ledger_and_states(self) -> None:
            if not self.model:
                return
            with engine.connect() as conn:
                rows = conn.execute(
                    sa.text(
                        """
                        SELECT j.id, j.status, j.reconcile_attempts,
                          j.reconcile_last_error,
                          (SELECT array_agg(u.status::text) FROM usage_logs u WHERE u.job_id = j.id) AS usage,
                          c.subscription_credits + c.topup_credits AS balance
                        FROM jobs j JOIN user_credits c ON c.user_id = j.user_id
                        """
                    )
                ).all()
            assert len(rows) == len(self.model)
            for r in rows:
                job = self.model[uuid.UUID(str(r.id))]
                usage = list(r.usage or [])
                assert len(usage) == 1, f"{job.job_id}: usage logs {usage}"
                state = usage[0]
                # At most one commit or refund per reservation, and it never changes afterwards.
                if job.settled is not None:
                    assert state == job.settled, f"{job.job_id}: {job.settled} became {state}"
                elif state != "reserved":
                    job.settled = state
                # Conservation: pools + reserved + committed = initial.
                held = job.amount if state in ("reserved", "committed") else Decimal(0)
                assert Decimal(r.balance) + held == START, (
                    f"{job.job_id}: balance {r.balance}, {state} {job.amount}"
                )
                # Terminal states are final and settled the right way.
                if job.terminal is not None:
                    assert r.status == job.terminal, f"{job.job_id}: {job.terminal} became {r.status}"
                elif r.status in TERMINAL:
                    job.terminal = r.status
                expected = {"completed": "committed", "failed": "refunded", "cancelled": "refunded"}
                if r.status in TERMINAL:
                    assert state == expected[r.status], f"{job.job_id}: {r.status} with credits {state}"
                    assert job.outcome not in ("fail", "run_forever", "media_expired", "data_removed") or (
                        r.status != "completed"
                    ), f"{job.job_id}: completed from a {job.outcome} upstream"
                else:
                    assert state == "reserved", f"{job.job_id}: in flight with credits {state}"
                    # Under the cap: the run that takes over a dead run's lease at the cap
                    # force-fails the job in its claim step (chaos/test_attempt_cap_dying_runs.py pins it).
                    assert r.reconcile_attempts < SETTINGS.max_attempts, (
                        f"{job.job_id}: {r.reconcile_attempts} attempts"
                    )

        @invariant()
        def every_inflight_job_is_due_leased_or_waiting(self) -> None:
            with engine.connect() as conn:
                due = {r.id for r in jobs_db.scan_stale(conn, 10_000)}
                rows = conn.execute(
                    sa.text(
                        """
                        SELECT id, provider_kind,
                          reconcile_lease_expires_at > now() AS leased,
                          reconcile_next_at > now() AS waiting,
                          now() - COALESCE(provider_call_started_at, started_at, created_at) AS age,
                          provider_call_started_at IS NULL AS before_call
                        FROM jobs WHERE status IN ('pending', 'processing')
                        """
                    )
                ).all()
            for r in rows:
                # A row that has not reached its provider call waits out the pre-call budget.
                threshold = precall_budget() if r.before_call else get_kind(r.provider_kind).stale_threshold
                young = r.age < threshold
                assert (
                    uuid.UUID(str(r.id)) in {uuid.UUID(str(d)) for d in due} or r.leased or r.waiting or young
                ), f"job {r.id} is in flight but neither due, leased, waiting nor young (age {r.age})"

    return JobsMachine


@pytest.mark.timeout(0)
@pytest.mark.slow
def test_jobs_state_machine(engine: sa.Engine, sandbox: SandboxServer, tmp_path: Any) -> None:
    """``sandbox`` (conftest) points the provider environment at the loopback sandbox."""
    machine = make_machine(engine, str(tmp_path))
    run_state_machine_as_test(machine, settings=settings.get_profile(PROFILE))
