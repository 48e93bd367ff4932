"""A device-plugin cluster and a DRA cluster with the same profiles and tenants, under the Pulumi mock engine
(tests/fixtures/environments/dra.yaml): the DRA driver's pinned chart with every key checked, the operator's device
plugin off there only, gpushare's DeviceClasses and per-tenant claim templates in order, Kueue's deviceClassMappings,
the DRA admission policies, and the experimental GPUCluster path."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpushare.core import dra
from gpushare.core.errors import GpushareError
from gpushare.core.resolve import resolve
from gpushare.ops.preview import Plan, PlannedResource
from gpushare.policy.admission import DRA_CLAIMS_POLICY
from gpushare.program.components import dra_driver
from gpushare.program.components import operator_values as ov
from gpushare.program.components.tenancy import device_class_mapping_problems
from tests.conftest import PROFILES, WORKSPACE
from tests.unit.program.helpers import plan_of

ENV = WORKSPACE / "environments" / "dra.yaml"
MONITORING = {"gpushare:monitoring": {"mode": "install", "release": "kube-prometheus-stack",
                                      "namespace": "monitoring"}}
DRA, PLUGIN = "lab-dra", "lab-plugin"
# The Kubernetes minors DRA objects must validate against (resource.k8s.io/v1 from 1.34).
MINORS = ("1.34", "1.35", "1.36", "1.37")


@functools.cache
def shipped_dra() -> Plan:
    return plan_of(ENV, MONITORING)


def fleet() -> Any:
    return resolve(ENV, PROFILES)


def releases(plan: Plan, cluster: str) -> dict[str, PlannedResource]:
    return {r.inputs["chart"]: r for r in plan.of_type("helm.sh/v3:Release") if plan.cluster_of(r) == cluster}


def in_cluster(plan: Plan, suffix: str, cluster: str) -> list[PlannedResource]:
    return [r for r in plan.of_type(suffix) if plan.cluster_of(r) == cluster]


def test_the_dra_cluster_gets_the_pinned_driver_chart_after_the_operator() -> None:
    plan = shipped_dra()
    charts = releases(plan, DRA)
    driver, operator = charts[dra_driver.CHART], charts[ov.CHART]
    assert driver.inputs["version"] == "0.5.0" == dra.driver_version(fleet().clusters[DRA]).removeprefix("v")
    assert driver.inputs["namespace"] == ov.NAMESPACE
    assert operator.urn in driver.dependencies
    assert dra_driver.CHART not in releases(plan, PLUGIN)


def test_driver_values_are_the_charts_and_follow_the_profiles() -> None:
    values = releases(shipped_dra(), DRA)[dra_driver.CHART].inputs["values"]
    assert dra_driver.check_chart_values(dict(values)) == []
    assert values["gpuResourcesEnabledOverride"] is True  # the chart refuses gpus without it
    assert values["resourceApiVersion"] == "resource.k8s.io/v1"
    assert values["resources"]["computeDomains"]["enabled"] is False
    assert values["featureGates"] == dra.feature_gates(fleet(), DRA)
    assert {"TimeSlicingSettings", "ConsumableShares", "DynamicMIG"} <= set(values["featureGates"])
    assert values["consumableShares"] == "4"  # notebooks-ts4: four pods per GPU, as its device-plugin replicas
    assert values["nvidiaDriverRoot"] == "/"  # Ansible-managed hosts keep the driver on the host


def test_unknown_driver_chart_keys_are_refused() -> None:
    assert dra_driver.unknown_keys({"featureGates": {"AnyGate": True}, "kubeletPlugin": {"tolerations": []}}) == []
    (problem,) = dra_driver.check_chart_values({"kubeletPlugin": {"toleration": []}})
    assert "kubeletPlugin.toleration" in problem.message and "dra-driver-values.yaml" in (problem.fix or "")


def test_the_operator_device_plugin_is_off_only_on_the_dra_cluster() -> None:
    plan = shipped_dra()
    dra_values = releases(plan, DRA)[ov.CHART].inputs["values"]
    plugin_values = releases(plan, PLUGIN)[ov.CHART].inputs["values"]
    assert dra_values["devicePlugin"]["enabled"] is False
    assert plugin_values["devicePlugin"]["enabled"] is True
    # The chart path keeps the ClusterPolicy: driver, toolkit and DCGM stay the operator's.
    assert "clusterPolicy" not in dra_values and "gpuCluster" not in dra_values
    assert dra_values["dcgmExporter"]["enabled"] is True


def test_device_classes_only_on_the_dra_cluster() -> None:
    plan = shipped_dra()
    names = {r.inputs["metadata"]["name"] for r in in_cluster(plan, ":DeviceClass", DRA)}
    assert names == {p.name for p in dra.class_plans(fleet(), DRA)}
    assert "gpushare-mig-balanced-3g.40gb" in names and "gpushare-notebooks-ts4" in names
    assert not in_cluster(plan, ":DeviceClass", PLUGIN) and not in_cluster(plan, ":ResourceClaimTemplate", PLUGIN)
    driver = releases(plan, DRA)[dra_driver.CHART]
    for r in in_cluster(plan, ":DeviceClass", DRA):
        assert driver.urn in r.dependencies
        assert r.inputs["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpushare"


def test_claim_templates_per_tenant_after_namespace_and_classes() -> None:
    plan = shipped_dra()
    f = fleet()
    namespaces = {r.inputs["metadata"]["name"]: r.urn for r in in_cluster(plan, ":Namespace", DRA)}
    classes = {r.inputs["metadata"]["name"]: r.urn for r in in_cluster(plan, ":DeviceClass", DRA)}
    templates = in_cluster(plan, ":ResourceClaimTemplate", DRA)
    for tenant in f.tenants:
        mine = {r.inputs["metadata"]["name"] for r in templates
                if r.inputs["metadata"]["namespace"] == tenant.namespace}
        assert mine == dra.allowed_templates(f, DRA, tenant)
    partner = {r.inputs["metadata"]["name"] for r in templates if r.inputs["metadata"]["namespace"] == "partner-eval"}
    assert partner and all("notebooks" not in n for n in partner)  # untrusted: hardware-isolated classes only
    for r in templates:
        assert namespaces[r.inputs["metadata"]["namespace"]] in r.dependencies
        assert classes[r.inputs["metadata"]["name"]] in r.dependencies


def test_kueue_maps_each_class_to_the_device_plugin_quota_name() -> None:
    plan = shipped_dra()
    dra_kueue = next(r for c, r in releases(plan, DRA).items() if c.endswith("/kueue"))
    plugin_kueue = next(r for c, r in releases(plan, PLUGIN).items() if c.endswith("/kueue"))
    plugin_config = yaml.safe_load(plugin_kueue.inputs["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert "deviceClassMappings" not in plugin_config.get("resources", {})  # device-plugin clusters map nothing
    config = yaml.safe_load(dra_kueue.inputs["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert config["kind"] == "Configuration" and config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    mappings = {m["name"]: m["deviceClassNames"] for m in config["resources"]["deviceClassMappings"]}
    assert "gpushare-mig-balanced-3g.40gb" in mappings["nvidia.com/mig-3g.40gb"]
    assert mappings["nvidia.com/gpu.shared"] == ["gpushare-notebooks-ts4"]
    # Every quota name a ClusterQueue of the DRA cluster counts is one Kueue can map claims to.
    quota_names = {res["name"] for q in in_cluster(plan, ":ClusterQueue", DRA)
                   for group in q.inputs["spec"]["resourceGroups"] for flavor in group["flavors"]
                   for res in flavor["resources"]}
    assert {n for n in quota_names if n.startswith("nvidia.com/")} <= set(mappings)
    assert config["integrations"]  # the chart's own settings are kept


def test_kueue_mapping_limits() -> None:
    assert device_class_mapping_problems([{"name": f"r{i}", "deviceClassNames": ["a"]} for i in range(16)]) == []
    assert device_class_mapping_problems([{"name": f"r{i}", "deviceClassNames": ["a"]} for i in range(17)])
    (long,) = device_class_mapping_problems([{"name": "r", "deviceClassNames": ["gpushare-" + "x" * 60]}])
    assert "63" in long.message


def test_dra_admission_on_the_dra_cluster_only() -> None:
    plan = shipped_dra()

    def policies(cluster: str) -> set[str]:
        return {r.inputs["metadata"]["name"] for r in in_cluster(plan, ":ValidatingAdmissionPolicy", cluster)}

    assert {"gpushare-dra-claim-templates", "gpushare-dra-no-extended-gpu", DRA_CLAIMS_POLICY} <= policies(DRA)
    assert "gpushare-no-resource-claims" not in policies(DRA)
    assert "gpushare-no-resource-claims" in policies(PLUGIN) and DRA_CLAIMS_POLICY not in policies(PLUGIN)
    (templates,) = [r for r in in_cluster(plan, ":ValidatingAdmissionPolicy", DRA)
                    if r.inputs["metadata"]["name"] == "gpushare-dra-claim-templates"]
    expression = templates.inputs["spec"]["validations"][0]["expression"]
    assert "'partner-eval/gpushare-mig-balanced-1g.10gb'" in expression
    assert "'partner-eval/gpushare-notebooks-ts4'" not in expression


@pytest.mark.parametrize("minor", MINORS)
def test_dra_objects_are_valid_kubernetes(minor: str) -> None:
    plan = shipped_dra()
    kinds = {":DeviceClass": "DeviceClass", ":ResourceClaimTemplate": "ResourceClaimTemplate",
             ":ValidatingAdmissionPolicy": "ValidatingAdmissionPolicy"}
    for suffix, kind in kinds.items():
        for r in in_cluster(plan, suffix, DRA):
            body = {"apiVersion": r.type.split(":")[1], "kind": kind, **r.inputs}
            kubernetes_validate.validate(body, minor, strict=True)


def _variant(tmp_path: Path, change: Any) -> Path:
    data = yaml.safe_load(ENV.read_text())
    change(data)
    path = tmp_path / "dra.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_gpu_cluster_install_goes_through_the_operator(tmp_path: Path) -> None:
    def gpu_cluster(data: dict[str, Any]) -> None:
        data["clusters"][1]["dra"]["install"] = "gpu-cluster"

    plan = plan_of(_variant(tmp_path, gpu_cluster), MONITORING)
    charts = releases(plan, DRA)
    assert dra_driver.CHART not in charts
    values = charts[ov.CHART].inputs["values"]
    assert values["clusterPolicy"] == {"deployCR": False} and values["gpuCluster"] == {"deployCR": True}
    assert values["draDriver"]["version"] == "v0.5.0"
    assert values["draDriver"]["featureGates"] == dra.feature_gates(fleet(), DRA)
    assert values["draDriver"]["gpus"]["kubeletPlugin"]["env"] == [{"name": "CONSUMABLE_SHARES", "value": "4"}]
    assert ov.check_chart_values(dict(values)) == []
    assert in_cluster(plan, ":DeviceClass", DRA)  # gpushare's classes either way


def test_mixed_host_managers_are_refused_on_a_dra_cluster() -> None:
    f = fleet()
    gpus = ov.ClusterGpus.of(f, f.clusters[DRA])
    assert dra_driver.driver_root(gpus) == "/"
    first, *rest = gpus.nodes
    mixed = ov.ClusterGpus(gpus.cluster, (dataclasses.replace(first, managed_by="gpu-operator"), *rest))
    with pytest.raises(GpushareError, match="nvidiaDriverRoot"):
        dra_driver.driver_root(mixed)
    operator = ov.ClusterGpus(gpus.cluster, tuple(dataclasses.replace(n, managed_by="gpu-operator")
                                                  for n in gpus.nodes))
    assert dra_driver.driver_root(operator) == dra_driver.OPERATOR_DRIVER_ROOT


def test_dynamic_mig_beside_a_static_layout_never_reaches_the_program(tmp_path: Path) -> None:
    def static(data: dict[str, Any]) -> None:
        next(p for p in data["pools"] if p["name"] == "dra-mig")["mig_mode"] = "static"

    with pytest.raises(GpushareError, match="DynamicMIG"):
        plan_of(_variant(tmp_path, static), MONITORING)


def test_every_device_class_config_is_one_the_driver_decodes() -> None:
    classes = in_cluster(shipped_dra(), ":DeviceClass", DRA)
    assert classes
    for r in classes:
        for entry in r.inputs["spec"]["config"]:
            assert entry["opaque"]["driver"] == "gpu.nvidia.com"
            assert dra.config_problems(entry["opaque"]["parameters"]) == [], r.name


def test_an_existing_kueue_gets_no_mappings_and_a_warning() -> None:
    plan = plan_of(ENV, {**MONITORING, "gpushare:kueue": {"mode": "existing"}})
    assert not [c for c in releases(plan, DRA) if c.endswith("/kueue")]
    assert any("deviceClassMappings" in w and DRA in w for w in plan.warnings)
