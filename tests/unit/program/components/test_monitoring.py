"""Monitoring under the Pulumi mock engine: an installed monitoring stack is pinned and exports the node labels the
rules read; an existing one gets only gpushare's objects, with its release label; custom resources are registered
one by one."""

from __future__ import annotations

import json

from gpushare.ops.preview import collect_plan
from tests.unit.program.helpers import (
    dev_config,
    operator_release,
    shipped,
)

# ---------------------------------------------------------------- Monitoring


def test_installed_monitoring_stack_is_pinned_and_exports_the_node_labels_the_rules_read() -> None:
    plan = shipped("dev")
    (kps,) = [r for r in plan.of_type("helm.sh/v3:Release") if r.inputs["chart"] == "kube-prometheus-stack"]
    assert kps.inputs["version"] == "88.5.3"
    assert kps.inputs["repositoryOpts"] == {"repo": "https://prometheus-community.github.io/helm-charts"}
    allowlist = kps.inputs["values"]["kube-state-metrics"]["metricLabelsAllowlist"]
    assert len(allowlist) == 1 and allowlist[0].startswith("nodes=[")
    for label in ("gpushare.io/pool", "gpushare.io/mig-config.state", "nvidia.com/mig.config.state"):
        assert label in allowlist[0]
    (rule,) = plan.of_type(":PrometheusRule")
    # kube_pod_nodeselectors is opt-in in kube-state-metrics: the rules read it, so the chart must turn it on.
    assert "kube_pod_nodeselectors" in json.dumps(rule.inputs["spec"])
    assert kps.inputs["values"]["kube-state-metrics"]["extraArgs"] == ["--metric-opt-in-list=kube_pod_nodeselectors"]
    assert kps.urn in rule.dependencies and kps.urn in operator_release(plan).dependencies
    assert rule.inputs["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    dashboards = [r for r in plan.of_type(":ConfigMap") if r.inputs["metadata"]["labels"].get("grafana_dashboard")]
    assert dashboards and all(r.inputs["metadata"]["labels"]["grafana_dashboard"] == "1" for r in dashboards)
    for r in dashboards:
        (text,) = r.inputs["data"].values()
        assert json.loads(text)["title"]


def test_existing_monitoring_stack_gets_only_our_objects_with_its_release_label() -> None:
    plan = collect_plan("dev", dev_config(monitoring={"mode": "existing", "release": "prom", "namespace": "obs"}))
    # no kube-prometheus-stack of ours; the GPU Operator and Kueue (Tenancy) are still installed
    assert sorted(r.inputs["chart"] for r in plan.of_type("helm.sh/v3:Release")) == [
        "gpu-operator", "oci://registry.k8s.io/kueue/charts/kueue"]
    (rule,) = plan.of_type(":PrometheusRule")
    assert rule.inputs["metadata"]["labels"]["release"] == "prom" and rule.inputs["metadata"]["namespace"] == "obs"
    values = operator_release(plan).inputs["values"]
    assert values["dcgmExporter"]["serviceMonitor"]["additionalLabels"] == {"release": "prom"}
    assert any("cannot be checked here" in w for w in plan.warnings)


def test_custom_resources_are_registered_one_by_one() -> None:
    plan = shipped("pilot")
    types = {r.type for r in plan.resources}
    assert "kubernetes:yaml/v2:ConfigGroup" not in types and "kubernetes:helm.sh/v4:Chart" not in types
    assert len(plan.of_type(":PrometheusRule")) == 2
