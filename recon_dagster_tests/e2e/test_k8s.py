"""The Kubernetes path, checked offline (no cluster, no chart download):

- ``deploy/dagster-k8s.yaml`` passes Dagster's own instance config schema, and each configurable
  section the schema of its class, with dagster-k8s installed (the ``k8s`` extra);
- a reconcile run's Kubernetes Job, rendered by dagster-k8s's own ``K8sRunLauncher.launch_run``
  (the Kubernetes API call captured instead of sent), passes the Kubernetes API schema of the
  oldest and newest cluster versions we document, strictly (``kubernetes-validate``: no unknown
  field), and carries the image, secrets, environment and resources the deploy files say;
- ``deploy/helm/values.yaml`` only uses keys the Dagster chart declares. How far that goes: the
  chart's ``values.schema.json`` ships with the chart, not in any Python package, so the keys below
  were recorded from the chart's schema models (helm/dagster/schema in the dagster repository) for
  the sections this file sets; types inside Kubernetes objects (resources, env) are checked by the
  Job validation above, not here, and the chart's own ``helm lint`` / install-time schema check
  remains the last word;
- the run pod's resources are the same in the three files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import kubernetes
import kubernetes_validate
import pytest
import yaml
from dagster._config import process_config, resolve_to_config_type
from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.instance.config import dagster_instance_config
from dagster._core.launcher import LaunchRunContext
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster_k8s import K8sRunLauncher
from dagster_postgres import PostgresRunStorage

from recon_dagster.core.paths import project_root

ROOT = project_root() or Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "dagster-k8s.yaml"
VALUES = ROOT / "deploy" / "helm" / "values.yaml"
# The cluster versions docs/deploying.md names: the oldest we support and the newest the
# installed kubernetes-validate knows.
K8S_VERSIONS = ("1.31.0", "1.37.0")
IMAGE = "registry.example.com/recon-dagster:0.2.0"


def _deploy() -> dict[str, Any]:
    return yaml.safe_load(DEPLOY.read_text())


def _valid(config_type: Any, value: Any) -> Any:
    result = process_config(resolve_to_config_type(config_type), value)
    assert result.success, [e.message for e in result.errors or []]
    return result.value


def test_the_k8s_instance_file_passes_dagsters_instance_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "DAGSTER_POSTGRES_URL", "postgresql+psycopg2://dagster:secret@postgres.internal:5432/recon_dagster"
    )
    (tmp_path / "dagster.yaml").write_text(DEPLOY.read_text())
    config, _ = dagster_instance_config(str(tmp_path))  # raises on anything the schema refuses
    deploy = _deploy()
    assert (deploy["run_launcher"]["module"], deploy["run_launcher"]["class"]) == (
        "dagster_k8s",
        "K8sRunLauncher",
    )
    _valid(K8sRunLauncher.config_type(), deploy["run_launcher"]["config"])
    assert deploy["run_coordinator"]["class"] == "QueuedRunCoordinator"
    _valid(QueuedRunCoordinator.config_type(), deploy["run_coordinator"]["config"])
    _valid(PostgresRunStorage.config_type(), deploy["storage"]["postgres"])
    assert config["run_launcher"]["class"] == "K8sRunLauncher"


class _CapturedBatchApi:
    """Stands in for the Kubernetes batch API: keeps the Job instead of sending it."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Any, str]] = []

    def create_namespaced_job(self, body: Any, namespace: str, **_: Any) -> Any:
        self.jobs.append((body, namespace))
        return body


def _kubeconfig(tmp_path: Path) -> Path:
    # A cluster nobody listens on: the client is built from it and never used.
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "offline",
        "clusters": [{"name": "offline", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "offline", "context": {"cluster": "offline", "user": "offline"}}],
        "users": [{"name": "offline", "user": {"token": "unused"}}],
    }))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def run_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """A reconcile run's Job as dagster-k8s renders it from deploy/dagster-k8s.yaml (as a dict)."""
    tmp = tmp_path_factory.mktemp("k8s")
    config = _valid(K8sRunLauncher.config_type(), _deploy()["run_launcher"]["config"])
    # Outside a cluster the only change: the kube config is read from a file, not the pod's account.
    config.update(load_incluster_config=False, kubeconfig_file=str(_kubeconfig(tmp)))
    batch = _CapturedBatchApi()
    launcher = K8sRunLauncher(**config, k8s_client_batch_api=batch, k8s_client_core_api=object())
    origin = JobPythonOrigin(
        "reconcile_job",
        RepositoryPythonOrigin(
            executable_path="/usr/local/bin/python",
            code_pointer=ModuleCodePointer("recon_dagster.definitions", "defs", None),
            container_image=IMAGE,  # what the code server reports (DAGSTER_CURRENT_IMAGE)
            entry_point=["dagster"],
        ),
    )
    with dg.instance_for_test() as instance:
        launcher.register_instance(instance)
        run = instance.add_run(
            dg.DagsterRun(
                job_name="reconcile_job",
                job_code_origin=origin,
                tags={
                    "recon/provider_kind": "kie-standard",
                    "recon/provider": "kie",
                    "recon/provider_lane": "kie/small",
                },
            )
        )
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    ((job, namespace),) = batch.jobs
    return kubernetes.client.ApiClient().sanitize_for_serialization(job), namespace


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_run_job_passes_the_kubernetes_api_schema_strictly(
    run_job: tuple[dict, str], version: str
) -> None:
    job, _ = run_job
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    kubernetes_validate.validate(job, version, strict=True)  # raises ValidationError on any fault


def test_a_field_the_api_does_not_know_is_caught(run_job: tuple[dict, str]) -> None:
    # The check has teeth: the same Job with a misspelt container field fails validation.
    job, _ = run_job
    broken = yaml.safe_load(yaml.safe_dump(job))
    broken["spec"]["template"]["spec"]["containers"][0]["resource"] = {"limits": {"memory": "1Gi"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_the_run_pod_carries_what_the_deploy_file_says(run_job: tuple[dict, str]) -> None:
    job, namespace = run_job
    launcher = _deploy()["run_launcher"]["config"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert namespace == launcher["job_namespace"]
    assert pod["serviceAccountName"] == launcher["service_account_name"]
    assert container["image"] == IMAGE
    assert container["args"][:3] == ["dagster", "api", "execute_run"]
    assert container["resources"] == launcher["run_k8s_config"]["container_config"]["resources"]
    assert {"secretRef": {"name": "recon-dagster-secrets"}} in container["envFrom"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RECON_LIMITS"] == "database"
    # Secrets reach the pod by reference only: no value of a secret variable is in the Job.
    for name in ("RECON_DATABASE_URL", "KIE_API_KEY", "DAGSTER_POSTGRES_URL"):
        assert name not in env
    # The pod's DAGSTER_HOME is the image's (Dockerfile); its instance comes in execute_run's args.
    assert f"DAGSTER_HOME={env['DAGSTER_HOME']}" in (ROOT / "Dockerfile").read_text()
    assert '"InstanceRef"' in container["args"][3]


# --- the Helm values ------------------------------------------------------------------------------

LIST = "[]"  # the items of a list
ANY = None  # a Kubernetes object or free-form map: validated elsewhere, or by the chart

# The keys the Dagster chart declares for the sections deploy/helm/values.yaml sets (recorded from
# the chart's schema models; see the module doc for how far this goes).
_IMAGE = {"repository": ANY, "tag": ANY, "pullPolicy": ANY}
_SECRET_REF = {LIST: {"name": ANY}}
_ENV = {LIST: {"name": ANY, "value": ANY, "valueFrom": ANY}}
_TAG_LIMIT = {"key": ANY, "value": ANY, "limit": ANY}  # value: a string or {applyLimitPerUniqueValue}
_K8S_OBJECTS = {k: ANY for k in (
    "annotations", "nodeSelector", "affinity", "tolerations", "podSecurityContext", "securityContext",
    "resources", "livenessProbe", "readinessProbe", "startupProbe", "labels", "volumeMounts", "volumes",
)}  # fmt: skip
CHART_KEYS: dict[str, Any] = {
    # The chart's tick retention, rendered into the instance's dagster.yaml `retention:`.
    "retention": {"enabled": ANY, "schedule": {"purgeAfterDays": ANY}, "sensor": {"purgeAfterDays": ANY}},
    "dagster-user-deployments": {
        "enabled": ANY, "enableSubchart": ANY, "imagePullSecrets": ANY,
        "deployments": {LIST: {
            "name": ANY, "image": _IMAGE, "port": ANY, "dagsterApiGrpcArgs": ANY, "codeServerArgs": ANY,
            "includeConfigInLaunchedRuns": {"enabled": ANY}, "env": _ENV, "envConfigMaps": ANY,
            "envSecrets": _SECRET_REF, "schedulerName": ANY, **_K8S_OBJECTS,
        }},
    },
    "runLauncher": {
        "type": ANY,
        "config": {"k8sRunLauncher": {
            "image": _IMAGE, "imagePullPolicy": ANY, "jobNamespace": ANY, "loadInclusterConfig": ANY,
            "kubeconfigFile": ANY, "envConfigMaps": ANY, "envSecrets": _SECRET_REF, "envVars": ANY,
            "volumeMounts": ANY, "volumes": ANY, "labels": ANY, "failPodOnRunFailure": ANY, "resources": ANY,
            "schedulerName": ANY, "securityContext": ANY,
            "runK8sConfig": {k: ANY for k in (
                "containerConfig", "podSpecConfig", "podTemplateSpecMetadata", "jobSpecConfig", "jobMetadata"
            )},
        }},
    },
    "dagsterDaemon": {
        "enabled": ANY, "image": _IMAGE, "heartbeatTolerance": ANY, "env": ANY, "envConfigMaps": ANY,
        "envSecrets": _SECRET_REF, "deploymentLabels": ANY, "runMonitoring": ANY, "runRetries": ANY,
        "sensors": {"useThreads": ANY, "numWorkers": ANY, "numSubmitWorkers": ANY},
        "schedules": {"useThreads": ANY, "numWorkers": ANY, "numSubmitWorkers": ANY},
        "runCoordinator": {
            "enabled": ANY, "type": ANY,
            "config": {"queuedRunCoordinator": {
                "maxConcurrentRuns": ANY, "tagConcurrencyLimits": {LIST: _TAG_LIMIT},
                "dequeueIntervalSeconds": ANY, "dequeueNumWorkers": ANY, "dequeueUseThreads": ANY,
            }},
        },
        **_K8S_OBJECTS,
    },
    "postgresql": {
        "enabled": ANY, "image": ANY, "postgresqlScheme": ANY, "postgresqlHost": ANY, "postgresqlUsername": ANY,
        "postgresqlPassword": ANY, "postgresqlDatabase": ANY, "postgresqlParams": ANY, "service": {"port": ANY},
    },
    "global": {k: ANY for k in (
        "postgresqlSecretName", "dagsterHome", "serviceAccountName", "celeryConfigSecretName", "dagsterInstanceConfigMap"
    )},
    "telemetry": {"enabled": ANY},
}  # fmt: skip


def _unknown_keys(value: Any, allowed: Any, path: str) -> list[str]:
    if allowed is ANY:
        return []
    if isinstance(value, list):
        if LIST not in allowed:
            return [f"{path} is a list here, not in the chart"]
        return [
            bad for i, item in enumerate(value) for bad in _unknown_keys(item, allowed[LIST], f"{path}[{i}]")
        ]
    if not isinstance(value, dict):
        return [] if not isinstance(allowed, dict) or not allowed else [f"{path} should be a mapping"]
    return [
        bad
        for key, item in value.items()
        for bad in (
            _unknown_keys(item, allowed[key], f"{path}.{key}") if key in allowed else [f"{path}.{key}"]
        )
    ]


def test_the_helm_values_use_only_keys_the_chart_declares() -> None:
    values = yaml.safe_load(VALUES.read_text())
    assert _unknown_keys(values, CHART_KEYS, "values") == []
    # The check has teeth: a misspelt key is named.
    values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]["maxConcurrentRun"] = 1
    assert _unknown_keys(values, CHART_KEYS, "values") == [
        "values.dagsterDaemon.runCoordinator.config.queuedRunCoordinator.maxConcurrentRun"
    ]


def test_the_run_pod_resources_are_the_same_in_every_deploy_file() -> None:
    values = yaml.safe_load(VALUES.read_text())
    k8s = _deploy()["run_launcher"]["config"]["run_k8s_config"]["container_config"]["resources"]
    helm_runs = values["runLauncher"]["config"]["k8sRunLauncher"]["runK8sConfig"]["containerConfig"][
        "resources"
    ]
    helm_code_server = values["dagster-user-deployments"]["deployments"][0]["resources"]
    assert k8s == helm_runs == helm_code_server
    assert set(k8s) == {"requests", "limits"} and "memory" in k8s["limits"]
