"""The shipped ``dagster.yaml`` under the real daemon: Dagster's own run launcher, and a run
terminated from a webserver on another host (its own UTS namespace, so its own host name, as a
container has) ends CANCELED with its worker process gone, whether the daemon loads the code
location itself (``workspace.yaml``) or a gRPC code server serves it (``deploy/workspace.yaml``).

What this replaced: a home-made launcher that forked run workers beside the daemon and stopped them
by pid; from another host it reported the run CANCELING, left the worker running, and run
monitoring marked the run CANCELED 180 s later while it still worked.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import dagster as dg
import psutil
import pytest
import yaml
from dagster._core.launcher import DefaultRunLauncher

from recon_dagster.core.kinds import get_kind
from recon_dagster.core.paths import project_root
from recon_dagster_tests.support.daemon import daemon_process
from recon_dagster_tests.support.factories import make_job, make_user, reserve
from recon_dagster_tests.support.harness import wait_for
from recon_dagster_tests.support.instance import dagster_home
from recon_dagster_tests.support.reconcile import one
from recon_dagster_tests.support.sandbox_process import sandbox_process
from recon_dagster_tests.support.topology import code_server_process

ROOT = project_root() or Path(__file__).resolve().parents[2]
OTHER_HOST = "webserver-elsewhere"

# What the webserver's Terminate button does (the run coordinator: a queued run is cancelled in
# storage, a started one goes to the run launcher), in a process of its own on another host.
_TERMINATE = """
import socket, sys
import dagster as dg
with dg.DagsterInstance.get() as instance:
    print(socket.gethostname(), instance.run_coordinator.cancel_run(sys.argv[1]))
"""


def _another_host_available() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run([unshare, "--uts", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def _terminate_from_another_host(env: dict[str, str], run_id: str) -> str:
    cmd = ["unshare", "--uts", "sh", "-c", f'hostname {OTHER_HOST} && exec "$0" "$@"',
           sys.executable, "-c", _TERMINATE, run_id]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _worker_pid(inst: dg.DagsterInstance, run_id: str) -> int | None:
    for event in inst.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        found = re.fullmatch(r"Started process for run \(pid: (\d+)\)\.", event.message or "")
        if found:
            return int(found.group(1))
    return None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_shipped_dagster_yaml_uses_dagsters_own_launcher(tmp_path: Path) -> None:
    shipped = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    assert shipped["run_launcher"] == {"module": "dagster", "class": "DefaultRunLauncher"}
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump({"run_launcher": shipped["run_launcher"]}))
    with dg.DagsterInstance.from_config(str(tmp_path)) as inst:
        assert type(inst.run_launcher) is DefaultRunLauncher
    assert not (ROOT / "recon_dagster" / "runlauncher.py").exists()


@pytest.mark.daemon
@pytest.mark.parametrize("workspace", ["in-process", "grpc-code-server"])
def test_a_run_terminated_from_another_host_ends_canceled_and_its_worker_stops(
    db, database_url: str, tmp_path: Path, workspace: str
) -> None:
    if not _another_host_available():
        pytest.skip("needs `unshare --uts` (root) to give the terminating process a host name of its own")
    with sandbox_process(log_dir=tmp_path) as sandbox:
        user = make_user(db, sub=1000, topup=0)
        # Each poll answers after 120 s: the run is still polling when it is terminated.
        task = sandbox.add_task(
            "kie-standard", {"outcome": "succeed", "polls_before_done": 0, "latency_s": 120}
        )
        minutes = get_kind("kie-standard").stale_threshold.total_seconds() / 60 + 5
        job = make_job(
            db, user, provider_kind="kie-standard", provider_task_id=task, started_minutes_ago=minutes
        )
        reserve(db, job, user, Decimal(2))
        env = {
            **sandbox.env,
            "RECON_DATABASE_URL": database_url,
            "RECON_MEDIA_DIR": str(tmp_path / "media"),
            "RECON_SENSOR_INTERVAL_S": "1",
        }
        with dagster_home(database_url) as home, contextlib.ExitStack() as stack:
            home.dagster_yaml.write_text((ROOT / "dagster.yaml").read_text())  # as shipped
            if workspace == "grpc-code-server":
                stack.enter_context(code_server_process(home, env))  # rewrites workspace.yaml to it
            daemon = stack.enter_context(daemon_process(home, env))
            inst = stack.enter_context(home.instance())
            assert type(inst.run_launcher) is DefaultRunLauncher

            def polling() -> tuple[dg.DagsterRun, int] | None:
                for run in inst.get_runs(filters=dg.RunsFilter(job_name="reconcile_job")):
                    pid = _worker_pid(inst, run.run_id)
                    if run.status is dg.DagsterRunStatus.STARTED and pid is not None:
                        return run, pid
                return None

            run, pid = wait_for(polling, timeout_s=180, what="a polling run", logs=daemon.log_tail)
            assert _alive(pid)
            said = _terminate_from_another_host({**os.environ, **home.env()}, run.run_id)
            assert said == f"{OTHER_HOST} True", said

            def ended() -> dg.DagsterRun | None:
                now = inst.get_run_by_id(run.run_id)
                return now if now is not None and now.is_finished else None

            # Well inside run monitoring's 180 s cancel timeout: the terminate itself ended it.
            stopped = wait_for(ended, timeout_s=90, what="the terminated run to end", logs=daemon.log_tail)
            assert stopped.status is dg.DagsterRunStatus.CANCELED
            wait_for(
                lambda: not _alive(pid), timeout_s=30, what="the run worker to exit", logs=daemon.log_tail
            )
            # Nothing settled by the run that was stopped.
            status = one(db, "SELECT status FROM jobs WHERE id = :j", j=str(job))
            assert status == "processing"
