"""OTLP export, checked against a loopback OTLP/HTTP receiver that decodes what it gets
(OpenTelemetry's protobuf classes), through a real reconcile tick: the sensor, its runs executed
in-process, the sandbox over HTTP, PostgreSQL.

1. the run's metrics arrive by OTLP when its work is done (outcomes, committed and refunded credits
   with their amounts, polls, provider answers by class), labelled by kind and provider only;
2. each run is one trace: the sensor's ``reconcile run`` span is the root, the run's op spans and
   the per-job ``claim``/``poll``/``settle``/``download`` spans are in it, and each provider request
   is a client span under its job's poll with HTTP semantic conventions, no query, no key;
3. money is counted when its transaction commits: a refund rolled back is never counted.
"""

from __future__ import annotations

import uuid

import dagster as dg
import pytest
import sqlalchemy as sa

from recon_dagster.reconcile.finalize import fail_and_refund
from recon_dagster.sandbox import Scenario
from recon_dagster.telemetry import instruments, setup
from recon_dagster.telemetry.tracing import TRACEPARENT_TAG
from recon_dagster_tests.support.reconcile import make_defs, stale_job_with_task, tick
from recon_dagster_tests.support.telemetry import otlp_receiver, telemetry_on

pytestmark = pytest.mark.slow

FORBIDDEN_LABELS = {"job_id", "job", "user", "user_id", "task_id", "run_id"}


def test_a_reconcile_tick_pushes_its_metrics_and_one_trace_per_run(
    db, instance, media_dir, sandbox, monkeypatch
):
    with otlp_receiver() as (received, url), telemetry_on(monkeypatch, OTEL_EXPORTER_OTLP_ENDPOINT=url):
        _, done, _ = stale_job_with_task(db, sandbox, "replicate-prediction", Scenario(polls_before_done=0))
        _, gone, _ = stale_job_with_task(
            db, sandbox, "replicate-prediction", Scenario(outcome="fail", polls_before_done=0)
        )
        for _ in range(2):
            stale_job_with_task(
                db, sandbox, "kie-standard", Scenario(server_error_first=1000, outcome="run_forever")
            )
        defs = make_defs(media_dir, cadence_seconds=0, single_run_below=10)
        tick(defs, instance)
        # Everything below came by OTLP when each run's work was done (record_outcomes pushes).

        def total(metric: str, **labels: str) -> float:
            return received.total(metric, **labels)

        assert "application/x-protobuf" in received.content_types
        assert total("recon_reconcile_outcomes", kind="replicate-prediction", outcome="recovered") == 1
        assert total("recon_reconcile_outcomes", kind="replicate-prediction", outcome="failed") == 1
        assert total("recon_reconcile_outcomes", provider="kie", outcome="error") == 2
        assert total("recon_credits_committed_jobs", kind="replicate-prediction") == 1
        assert total("recon_credits_committed", kind="replicate-prediction") == 30  # the reserved 30
        assert total("recon_credits_refunded_jobs", kind="replicate-prediction") == 1
        assert total("recon_credits_refunded", kind="replicate-prediction") == 30
        assert total("recon_polls_sent", provider="kie") == 2
        assert total("recon_provider_answers", provider="kie", **{"class": "5xx"}) >= 2
        assert total("recon_provider_answers", provider="replicate", **{"class": "2xx"}) >= 2
        assert total("recon_limiter_wait", provider="replicate") >= 2  # a histogram: its count
        for p in received.points():
            assert not FORBIDDEN_LABELS & set(p.attributes), p
            assert str(done) not in p.attributes.values() and str(gone) not in p.attributes.values()

        spans = received.spans()
        runs = instance.get_runs(filters=dg.RunsFilter(job_name="reconcile_job"))
        assert len(runs) == 4
        key = sandbox.sandbox.api_key
        for run in runs:
            trace_id = run.tags[TRACEPARENT_TAG].split("-")[1]
            mine = [s for s in spans if s.trace_id == trace_id]
            names = [s.name for s in mine]
            assert names.count("reconcile run") == 1, names  # the root, from the sensor
            assert {"claim_and_poll", "claim", "poll"} <= set(names), names
            claim = next(s for s in mine if s.name == "claim")  # one statement: an event per job won
            job_ids = run.run_config["ops"]["claim_and_poll"]["config"]["job_ids"]
            assert [e[1]["recon.job_id"] for e in claim.events if e[0] == "claimed"] == job_ids
            by_id = {s.span_id: s for s in mine}
            root = next(s for s in mine if s.name == "reconcile run")
            assert root.parent_id == ""
            for s in mine:  # one trace: every span hangs from the root
                seen = s
                while seen.parent_id:
                    seen = by_id[seen.parent_id]
                assert seen is root, (s.name, names)
            http = [s for s in mine if s.attributes.get("http.request.method")]
            assert http, names
            for s in http:
                assert s.kind == 3  # SPAN_KIND_CLIENT
                assert by_id[s.parent_id].name == "poll"
                assert "?" not in s.attributes["url.full"]
                assert s.attributes["server.address"] == "127.0.0.1"
                assert isinstance(s.attributes["server.port"], int)
            for s in mine:
                for value in s.attributes.values():
                    assert key not in str(value), (s.name, s.attributes)
        kie_http = [s for s in spans if s.attributes.get("recon.provider") == "kie"]
        assert kie_http and all(
            str(s.attributes.get("http.response.status_code", "")).startswith("5") for s in kie_http
        )
        done_spans = [s for s in spans if s.attributes.get("recon.job_id") == str(done)]
        assert {"poll", "settle", "download"} <= {s.name for s in done_spans}


def test_a_refund_is_counted_when_its_transaction_commits_never_when_it_rolls_back(db, monkeypatch):
    from recon_dagster_tests.support.factories import make_job, make_user, reserve

    with telemetry_on(monkeypatch):
        sdk = setup.start("test")
        assert sdk is not None
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        reader = InMemoryMetricReader()
        from opentelemetry.sdk.metrics import MeterProvider

        provider = MeterProvider(metric_readers=[reader])
        instruments.install(provider.get_meter("test"))

        def refunded() -> float:
            data = reader.get_metrics_data()
            return sum(
                p.value
                for rm in (data.resource_metrics if data else [])
                for sm in rm.scope_metrics
                for m in sm.metrics
                if m.name == "recon_credits_refunded"
                for p in m.data.data_points
            )

        user = make_user(db, sub=100, topup=50)
        job = make_job(db, user, status="processing", provider_kind="kie-standard")
        reserve(db, job, user, 30, 20, 10)
        with pytest.raises(RuntimeError), db.begin() as conn:
            from recon_dagster.reconcile.finalize import _fail_and_refund

            assert _fail_and_refund(conn, job, "test", "kie-standard") is not None
            raise RuntimeError("the transaction fails after the refund")
        assert refunded() == 0
        with db.connect() as conn:
            status = conn.execute(sa.text("SELECT status FROM jobs WHERE id = :j"), {"j": str(job)})
            assert status.scalar() == "processing"
        assert fail_and_refund(db, job, "test", kind="kie-standard")
        assert refunded() == 30
        provider.shutdown()


def test_a_run_without_a_traceparent_is_still_one_trace_named_by_its_run_id():
    from opentelemetry import trace

    from recon_dagster.telemetry.tracing import run_context

    run_id = str(uuid.uuid4())
    ctx = run_context({}, run_id)
    assert trace.get_current_span(ctx).get_span_context().trace_id == uuid.UUID(run_id).int
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    ctx = run_context({TRACEPARENT_TAG: parent}, run_id)
    assert format(trace.get_current_span(ctx).get_span_context().trace_id, "032x") == parent.split("-")[1]
