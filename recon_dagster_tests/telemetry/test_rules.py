"""The shipped Prometheus rules: valid (``promtool check rules``), their own unit tests pass
(``promtool test rules``), the PrometheusRule holds the same groups, every rule queries declared
metrics and links a runbook section of docs/operations.md that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from recon_dagster.telemetry.instruments import METRICS
from recon_dagster_tests.support.telemetry import PROMTOOL, skip_unless_prometheus

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "recon-rules.yaml"
OPERATOR = ROOT / "deploy" / "prometheus" / "recon-prometheusrule.yaml"
TESTS = ROOT / "deploy" / "prometheus" / "recon-rules.test.yaml"


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


@skip_unless_prometheus()
def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    checked = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", TESTS.name], capture_output=True, text=True, cwd=TESTS.parent
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert has a unit test that expects it to fire.
    fired = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels", TESTS.read_text()))
    assert fired >= {r["alert"] for r in _rules()} - {
        "ReconPollsNotSent",
        "ReconOrphanTasks",
        "ReconSpendDifference",
        "ReconSensorSlow",
    }


def test_the_prometheusrule_holds_the_same_groups() -> None:
    operator = yaml.safe_load(OPERATOR.read_text())
    assert operator["apiVersion"] == "monitoring.coreos.com/v1" and operator["kind"] == "PrometheusRule"
    assert operator["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_every_rule_queries_declared_metrics_and_links_an_existing_runbook() -> None:
    declared = {m.prometheus_name for m in METRICS}
    page = (ROOT / "docs" / "operations.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", page, re.M)
    }
    for rule in _rules():
        used = set(re.findall(r"\b(recon_[a-z_]+)", rule["expr"]))
        assert used, rule["alert"]
        for name in used:
            assert re.sub(r"_(bucket|sum|count)$", "", name) in declared, (rule["alert"], name)
        url = rule["annotations"]["runbook_url"]
        assert url.startswith("docs/operations.md#"), url
        assert url.split("#", 1)[1] in anchors, (rule["alert"], url)
        assert rule["labels"]["severity"] in {"critical", "warning"}
