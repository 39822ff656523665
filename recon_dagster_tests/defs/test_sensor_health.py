"""The reconcile sensor's own health is alerted on (issue 48, item 5): ``reconcile_sensor_ticking``
fails while ``stale_inflight_jobs_sensor`` errors or skips on the database every tick, or stops
ticking, and passes again with the first good tick. Ticks are written to a real instance the way
the daemon records them."""

from __future__ import annotations

import time

import dagster as dg
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    RemoteInstigatorOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.scheduler.instigation import InstigatorState, InstigatorStatus, TickData, TickStatus
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster_shared.error import SerializableErrorInfo

from recon_dagster.defs.observe.sensor_health import SENSOR, reconcile_sensor_ticking, sensor_ticks


def _state(instance: dg.DagsterInstance) -> InstigatorState:
    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="recon_dagster.definitions"))
    origin = RemoteInstigatorOrigin(RemoteRepositoryOrigin(location, "__repository__"), SENSOR)
    state = InstigatorState(origin, InstigatorType.SENSOR, InstigatorStatus.DECLARED_IN_CODE)
    instance.add_instigator_state(state)
    return state


def _tick(instance, state, status, ago_s, *, error=None, skip=None) -> None:
    instance.create_tick(
        TickData(
            instigator_origin_id=state.instigator_origin_id,
            instigator_name=SENSOR,
            instigator_type=InstigatorType.SENSOR,
            status=status,
            timestamp=time.time() - ago_s,
            selector_id=state.selector_id,
            error=SerializableErrorInfo(error, [], "DagsterUserCodeLoadError") if error else None,
            skip_reason=skip,
        )
    )


def _evaluate(instance: dg.DagsterInstance) -> dg.AssetCheckResult:
    context = dg.build_asset_check_context(instance=instance)
    return reconcile_sensor_ticking(context)


def test_the_sensor_erroring_every_tick_fails_its_check_until_a_good_tick(instance) -> None:
    state = _state(instance)
    assert _evaluate(instance).passed  # never ticked: nothing to say
    for ago in (90, 60, 30):
        _tick(
            instance,
            state,
            TickStatus.FAILURE,
            ago,
            error="could not load code location: ImportError: no module\n...",
        )
    assert [t.status for t in sensor_ticks(instance)] == [TickStatus.FAILURE] * 3
    failing = _evaluate(instance)
    assert not failing.passed
    assert failing.description.startswith(
        f"{SENSOR} errored on its last 3 ticks: no job is reconciled; last: could not load"
    )
    _tick(instance, state, TickStatus.SKIPPED, 1, skip="no stale job due: scanned=0")
    assert _evaluate(instance).passed


def test_the_sensor_skipping_on_an_unavailable_database_fails_its_check(instance) -> None:
    state = _state(instance)
    for ago in (90, 60, 30):
        _tick(instance, state, TickStatus.SKIPPED, ago, skip="database unavailable, nothing scanned: refused")
    failing = _evaluate(instance)
    assert not failing.passed and "database unavailable" in failing.description


def test_a_sensor_that_stopped_ticking_fails_its_check(instance) -> None:
    state = _state(instance)
    _tick(instance, state, TickStatus.SKIPPED, 3600, skip="no stale job due")
    failing = _evaluate(instance)
    assert not failing.passed and "has not ticked for" in failing.description


def test_a_failed_first_health_run_gets_a_successor_until_one_succeeds(
    db, instance, media_dir, monkeypatch
) -> None:
    """The incident a failed first ``provider_health_job`` opened closes: that job is launched again
    (a fresh key each time) until a run of it succeeds, which resolves the incident."""
    from recon_dagster.defs.observe.health import provider_health_at_startup
    from recon_dagster.defs.resources import DatabaseResource
    from recon_dagster_tests.support.reconcile import make_defs

    defs = make_defs(media_dir)
    job = defs.resolve_job_def("provider_health_job")

    def tick() -> list[dg.RunRequest]:
        with dg.build_sensor_context(instance=instance, repository_def=defs.get_repository_def()) as ctx:
            return list(provider_health_at_startup.evaluate_tick(ctx).run_requests or [])

    [first] = tick()

    def down(self):  # first boot: the app's database not there yet
        raise RuntimeError("database unavailable at 127.0.0.1:1: connection refused")

    monkeypatch.setattr(DatabaseResource, "get_engine", down)
    failed = job.execute_in_process(
        instance=instance, tags={"dagster/run_key": first.run_key}, raise_on_error=False
    )
    assert not failed.success
    monkeypatch.undo()

    [again] = tick()
    assert again.run_key != first.run_key  # a key Dagster has not launched yet
    assert job.execute_in_process(instance=instance, tags={"dagster/run_key": again.run_key}).success
    assert tick() == []


def test_a_code_server_restart_does_not_fail_queued_runs(tmp_path) -> None:
    """The shipped run queues retry a queued run while its code server is unreachable (a deploy)
    for a minute instead of failing it at once (a failed run pages)."""
    import yaml

    from recon_dagster.core.paths import project_root

    root = project_root() or tmp_path
    shipped = yaml.safe_load((root / "dagster.yaml").read_text())
    with dg.instance_for_test(overrides={"run_queue": shipped["run_queue"]}) as inst:
        config = inst.get_concurrency_config().run_queue_config
    assert config.max_user_code_failure_retries * config.user_code_failure_retry_delay >= 60
    k8s = yaml.safe_load((root / "deploy" / "dagster-k8s.yaml").read_text())["run_coordinator"]["config"]
    assert k8s["max_user_code_failure_retries"] * k8s["user_code_failure_retry_delay"] >= 60
