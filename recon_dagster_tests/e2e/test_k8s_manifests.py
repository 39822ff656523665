"""The Kubernetes manifests of ``deploy/k8s/`` (issue 48, item 7), checked offline: each document
passes the Kubernetes API schema strictly (``kubernetes-validate``, the versions test_k8s.py uses),
and together they hold what a deployment needs: a migration Job on the owner's direct URL, example
Secrets naming every key, probes, a securityContext, a PodDisruptionBudget, a NetworkPolicy and a
way to run the operator CLI in the cluster."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from recon_dagster.config import Settings
from recon_dagster.core.kinds import provider_specs
from recon_dagster_tests.e2e.test_k8s import K8S_VERSIONS, ROOT

FOLDER = ROOT / "deploy" / "k8s"


def _docs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted(FOLDER.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def _one(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for _, d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name,doc", _docs(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_every_manifest_passes_the_api_schema_strictly(name: str, doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_migration_job_runs_migrate_on_the_owners_direct_url() -> None:
    job = _one("Job", "recon-dagster-migrate")
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["recon-dagster", "migrate"]
    [source] = container["envFrom"]
    secret = _one("Secret", source["secretRef"]["name"])
    assert set(secret["stringData"]) == {Settings.migrate_database_url.name}
    assert ":6432" not in secret["stringData"][Settings.migrate_database_url.name]  # not the pooler


def test_the_example_secret_names_every_key_the_deployment_reads() -> None:
    data = _one("Secret", "recon-dagster-secrets")["stringData"]
    wanted = {Settings.database_url.name, "DAGSTER_POSTGRES_URL"} | {
        s.settings.key_env for s in provider_specs()
    }
    assert wanted <= set(data)
    assert _one("Secret", "dagster-postgresql-secret")["stringData"]["postgresql-password"]


def test_the_code_server_is_probed_confined_and_protected() -> None:
    deployment = _one("Deployment", "recon-dagster-code-server")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"][:3] == ["dagster", "api", "grpc-health-check"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        doc = _one(kind, "recon-dagster-code-server")
        selector = doc["spec"].get("selector") or doc["spec"]["podSelector"]
        assert selector["matchLabels"].items() <= labels.items()
    # Lowercase no_proxy too: gRPC honours http_proxy, and the daemon's calls to this server must not
    # go through an egress proxy.
    env = {e["name"]: e["value"] for e in container["env"]}
    assert ".svc" in env["no_proxy"] and env["no_proxy"] == env["NO_PROXY"]


def test_the_operator_cli_runs_in_the_cluster_with_the_runtime_secrets() -> None:
    job = _one("Job", "recon-dagster-cli-status")
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "recon-dagster"
    assert container["envFrom"] == [{"secretRef": {"name": "recon-dagster-secrets"}}]
