"""The production topology on loopback: the code location served by a gRPC code server in its own
process, ``dagster-daemon`` and ``dagster-webserver`` in theirs, ``workspace.yaml`` pointing at the
gRPC server, the sandbox as a fourth process; a small backlog of two providers reconciled through
it, under a shared account budget that the sandbox's own request log confirms.
"""

from __future__ import annotations

import secrets
from decimal import Decimal
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.storage.tags import GRPC_INFO_TAG

from recon_dagster.core.kinds import get_kind
from recon_dagster_tests.support.daemon import daemon_process
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.harness import HarnessError, wait_for
from recon_dagster_tests.support.instance import dagster_home
from recon_dagster_tests.support.reconcile import one
from recon_dagster_tests.support.sandbox_process import sandbox_process
from recon_dagster_tests.support.topology import code_server_process, locations, webserver_process

pytestmark = pytest.mark.daemon

KINDS = ("kie-standard", "kie-lip-sync", "replicate-prediction")


def test_backlog_reconciled_through_grpc_code_server_daemon_and_webserver(
    db, database_url: str, tmp_path: Path
) -> None:
    with sandbox_process(log_dir=tmp_path) as sandbox:
        user = make_user(db, sub=1000, topup=0)
        jobs = []
        for i in range(12):
            kind = KINDS[i % len(KINDS)]
            task = sandbox.add_task(
                kind,
                {"outcome": "fail" if i % 4 == 3 else "succeed", "polls_before_done": 0, "media_size": 256},
            )
            minutes = get_kind(kind).stale_threshold.total_seconds() / 60 + 5
            job = make_job(db, user, provider_kind=kind, provider_task_id=task, started_minutes_ago=minutes)
            reserve(db, job, user, Decimal(2))
            jobs.append(job)
        budget = 6  # reads per 2 s per account: tight enough that the limiter has to work
        env = {
            **sandbox.env,
            "RECON_DATABASE_URL": database_url,
            "RECON_MEDIA_DIR": str(tmp_path / "media"),
            "RECON_SENSOR_INTERVAL_S": "1",
            "RECON_SINGLE_RUN_BELOW": "2",
            "RECON_RECONCILE_CADENCE_S": "1",
            "RECON_LIMIT_KIE": f"reads={budget}/2,account=kie-{secrets.token_hex(3)}",
            "RECON_LIMIT_REPLICATE": f"reads={budget}/2,account=rep-{secrets.token_hex(3)}",
        }

        def terminal() -> bool:
            left = one(
                db,
                "SELECT count(*) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[])) AND status IN ('pending','processing')",
                ids=[str(j) for j in jobs],
            )
            return left == 0

        with (
            # Dagster's default launcher, as dagster.yaml ships it: the code server the workspace
            # names starts each run.
            dagster_home(database_url, max_concurrent_runs=4) as home,
            code_server_process(home, env) as server,
            daemon_process(home, env) as daemon,
            webserver_process(home, env) as web,
        ):
            workspace = yaml.safe_load(home.workspace_yaml.read_text())
            assert workspace["load_from"][0]["grpc_server"]["port"] == server.port
            assert locations(web.port) == {"recon_dagster": "LOADED/RepositoryLocation"}
            wait_for(terminal, timeout_s=240, interval_s=1, what="the backlog to drain", logs=daemon.log_tail)
            with home.instance() as inst:
                runs = wait_for(
                    lambda: (
                        [r for r in inst.get_runs() if r.job_name == "reconcile_job"]
                        if all(r.is_finished for r in inst.get_runs())
                        else []
                    ),
                    timeout_s=60,
                    what="the runs to finish",
                    logs=daemon.log_tail,
                )
            assert server.alive() and daemon.alive() and web.alive()

        assert all(r.status is dg.DagsterRunStatus.SUCCESS for r in runs), [r.status for r in runs]
        for run in runs:
            # Launched from the code server's gRPC origin, never loaded by the daemon itself.
            origin = run.remote_job_origin.repository_origin.code_location_origin
            assert type(origin).__name__ == "GrpcServerCodeLocationOrigin" and origin.port == server.port
            assert GRPC_INFO_TAG in run.tags, run.tags.keys()
            assert run.tags["recon/provider"] in ("kie", "replicate")
        statuses = one(
            db,
            "SELECT string_agg(status, ',' ORDER BY status) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[]))",
            ids=[str(j) for j in jobs],
        )
        assert statuses.split(",").count("completed") == 9 and statuses.count("failed") == 3
        for provider in ("kie", "replicate"):
            seen = sandbox.requests(provider, "read", window_s=2)
            assert seen["count"] >= 4 and seen["max_in_window"] <= budget, (provider, seen["max_in_window"])


@pytest.mark.parametrize(
    "bad",
    [{"RECON_SINGLE_RUN_BELOW": str(10**9)}, {"RECON_BATCH_SIZE": "0"}, {"RECON_SENSOR_INTERVAL_S": "soon"}],
)
def test_a_daemon_with_a_setting_its_code_server_would_refuse_is_not_started(
    database_url: str, bad: dict[str, str]
) -> None:
    """The daemon itself starts with any setting, but its code server then fails to load the
    definitions and no run ever starts: the harness refuses up front, naming the setting (a
    benchmark's one-run-per-job phase waited out its whole timeout so)."""
    refused = pytest.raises(HarnessError, match=f"not started: {next(iter(bad))} must be")
    with dagster_home(database_url) as home, refused, daemon_process(home, bad):
        pass
