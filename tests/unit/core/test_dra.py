"""Dynamic Resource Allocation (issue 18): the model (cluster gpu_allocation, dra block, pool mig_mode), the refusals
`validate` gives for what a DRA cluster cannot realise, and the objects: DeviceClasses, ResourceClaimTemplates,
ResourceQuota entries and Kueue's deviceClassMappings, checked against the Kubernetes schemas of every supported
minor (1.34+) and against the DRA driver's opaque config types. Fixture: tests/fixtures/environments/dra.yaml."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import hypothesis.strategies as st
import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core import dra
from gpushare.core.errors import GpushareError
from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import ResolvedFleet, resolve, resolve_env
from gpushare.core.tenancy import QUOTA_NAME, fleet_tenancy
from tests.conftest import PROFILES, cluster_named, fixture_data, pool_named, tenant_named

DRA = "lab-dra"
PLUGIN = "lab-plugin"
# Every Kubernetes minor gpushare supports DRA on: resource.k8s.io/v1 is GA from 1.34.
MINORS = ["1.34", "1.35", "1.36", "1.37"]


@cache
def fleet() -> ResolvedFleet:
    return resolve_env("dra")


def tenant(name: str) -> Any:
    return next(t for t in fleet().tenants if t.name == name)


def data() -> dict[str, Any]:
    return copy.deepcopy(fixture_data("dra"))


def refused(write_env: Any, d: dict[str, Any]) -> GpushareError:
    with pytest.raises(GpushareError) as caught:
        resolve(write_env(d), PROFILES)
    return caught.value


def only_problem(error: GpushareError) -> Any:
    assert len(error.problems) == 1, [str(p) for p in error.problems]
    problem = error.problems[0]
    assert problem.file and problem.line and problem.fix, str(problem)
    return problem


# ---------------------------------------------------------------- the resolved fleet


def test_dra_nodes_have_no_device_plugin_config_and_dynamic_mig_leaves_mig_parted_out() -> None:
    f = fleet()
    for node in f.pool("dra-mig").nodes + f.pool("dra-notebooks").nodes:
        assert node.device_plugin_config is None
    assert f.pool("plugin-notebooks").nodes[0].device_plugin_config is not None
    assert f.pool("plugin-mig").nodes[0].mig_config is not None
    dynamic = f.pool("dra-llm").nodes[0]
    assert dynamic.mig_config is None and dynamic.mig_layout == {"4g.40gb": 1, "3g.40gb": 1}


def static_mig(d: dict[str, Any]) -> dict[str, Any]:
    for name in ("dra-mig", "dra-llm"):
        pool_named(d, name)["mig_mode"] = "static"
    return d


def test_static_mig_on_dra_keeps_mig_parted_and_needs_no_dynamic_gate(write_env: Any) -> None:
    f = resolve(write_env(static_mig(data())), PROFILES)
    assert f.pool("dra-mig").nodes[0].mig_config is not None  # mig-parted applies the layout, as today
    assert dra.feature_gates(f, DRA) == {"ConsumableShares": True, "TimeSlicingSettings": True}
    assert [o["metadata"]["name"] for o in dra.device_classes(f, DRA)] == [
        o["metadata"]["name"] for o in dra.device_classes(fleet(), DRA)]


def test_static_mig_beside_dynamic_mig_on_one_cluster_is_refused(write_env: Any) -> None:
    d = data()
    pool_named(d, "dra-mig")["mig_mode"] = "static"
    problem = only_problem(refused(write_env, d))
    assert problem.path == "pools[2].mig_mode" and "destroys" in problem.message
    d = static_mig(data())
    cluster_named(d, DRA)["dra"]["feature_gates"] = ["DynamicMIG"]
    assert len(refused(write_env, d).problems) == 2  # both static MIG pools


def test_same_profile_advertises_the_same_resources_on_both_clusters() -> None:
    f = fleet()
    assert f.pool("plugin-mig").totals.advertised == f.pool("dra-mig").totals.advertised
    assert f.pool("plugin-notebooks").totals.advertised == f.pool("dra-notebooks").totals.advertised


# ---------------------------------------------------------------- objects


def test_one_device_class_per_profile_and_mig_instance() -> None:
    names = [o["metadata"]["name"] for o in dra.device_classes(fleet(), DRA)]
    assert names == ["gpushare-exclusive", "gpushare-mig-balanced-1g.10gb", "gpushare-mig-balanced-2g.20gb",
                     "gpushare-mig-balanced-3g.40gb", "gpushare-mig-llm-serving-3g.40gb",
                     "gpushare-mig-llm-serving-4g.40gb", "gpushare-notebooks-ts4"]
    assert dra.device_classes(fleet(), PLUGIN) == []


def test_device_class_selects_the_drivers_attributes_and_carries_the_profiles_config() -> None:
    by_name = {o["metadata"]["name"]: o for o in dra.device_classes(fleet(), DRA)}
    mig = by_name["gpushare-mig-balanced-3g.40gb"]["spec"]
    assert mig["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && "
        "device.attributes['gpu.nvidia.com'].profile == '3g.40gb' && "
        "device.attributes['gpu.nvidia.com'].productName in ['NVIDIA A100-SXM4-80GB']")
    assert mig["config"][0]["opaque"]["parameters"] == {"apiVersion": "resource.nvidia.com/v1beta1",
                                                        "kind": "MigDeviceConfig"}
    ts = by_name["gpushare-notebooks-ts4"]["spec"]
    assert "type == 'gpu'" in ts["selectors"][0]["cel"]["expression"]
    assert ts["config"][0]["opaque"]["parameters"]["sharing"] == {
        "strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}
    assert by_name["gpushare-exclusive"]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpushare"


def test_claim_templates_follow_trust_and_take_one_exact_device() -> None:
    partner = {o["metadata"]["name"] for o in dra.claim_templates(fleet(), DRA, tenant("partner-eval"))}
    assert "gpushare-notebooks-ts4" not in partner and "gpushare-exclusive" in partner
    assert partner == dra.allowed_templates(fleet(), DRA, tenant("partner-eval"))
    assert "gpushare-notebooks-ts4" in dra.allowed_templates(fleet(), DRA, tenant("notebooks"))
    assert dra.allowed_templates(fleet(), PLUGIN, tenant("notebooks")) == set()
    assert dra.allowed_templates(fleet(), DRA, tenant("notebooks")) != set()
    for template in dra.claim_templates(fleet(), DRA, tenant("notebooks")):
        (request,) = template["spec"]["spec"]["devices"]["requests"]
        assert set(request) == {"name", "exactly"}  # Kueue admits only `exactly` requests
        assert template["metadata"]["name"] == request["exactly"]["deviceClassName"]
        assert template["metadata"]["namespace"] == "ds-notebooks"


def test_with_consumable_shares_isolated_claims_take_every_share() -> None:
    assert dra.consumable_shares(fleet(), DRA) == 4
    by_name = {o["metadata"]["name"]: o["spec"]["spec"]["devices"]["requests"][0]["exactly"]
               for o in dra.claim_templates(fleet(), DRA, tenant("notebooks"))}
    assert by_name["gpushare-exclusive"]["capacity"] == {"requests": {"shares": "4"}}
    assert by_name["gpushare-mig-balanced-1g.10gb"]["capacity"] == {"requests": {"shares": "4"}}
    assert "capacity" not in by_name["gpushare-notebooks-ts4"]


def test_kueue_maps_each_class_to_the_device_plugin_resource_name() -> None:
    mappings = {m["name"]: m["deviceClassNames"] for m in dra.kueue_device_class_mappings(fleet(), DRA)}
    assert mappings == {
        "nvidia.com/gpu": ["gpushare-exclusive"],
        "nvidia.com/gpu.shared": ["gpushare-notebooks-ts4"],
        "nvidia.com/mig-1g.10gb": ["gpushare-mig-balanced-1g.10gb"],
        "nvidia.com/mig-2g.20gb": ["gpushare-mig-balanced-2g.20gb"],
        "nvidia.com/mig-3g.40gb": ["gpushare-mig-balanced-3g.40gb", "gpushare-mig-llm-serving-3g.40gb"],
        "nvidia.com/mig-4g.40gb": ["gpushare-mig-llm-serving-4g.40gb"],
    }
    advertised = {r for p in fleet().pools if p.cluster == DRA for r in p.totals.advertised}
    assert set(mappings) == advertised


def test_feature_gates_follow_the_profiles_in_use() -> None:
    assert dra.feature_gates(fleet(), DRA) == {"ConsumableShares": True, "DynamicMIG": True,
                                               "TimeSlicingSettings": True}
    assert dra.feature_gates(fleet(), PLUGIN) == {}


def test_tenant_quota_counts_on_both_kinds_of_cluster() -> None:
    tenancy = fleet_tenancy(fleet(), load_guardrails())

    def quota(cluster: str, namespace: str) -> dict[str, str]:
        return next(o["spec"]["hard"] for o in tenancy[cluster].objects
                    if o["kind"] == "ResourceQuota" and o["metadata"]["namespace"] == namespace
                    and o["metadata"]["name"] == QUOTA_NAME)

    plugin, on_dra = quota(PLUGIN, "search-inference"), quota(DRA, "search-inference")
    assert plugin["requests.nvidia.com/mig-3g.40gb"] == on_dra["requests.nvidia.com/mig-3g.40gb"] == "6"
    assert not any(k.endswith(dra.QUOTA_SUFFIX) for k in plugin)
    assert on_dra["gpushare-mig-balanced-3g.40gb.deviceclass.resource.k8s.io/devices"] == "6"
    assert on_dra["gpushare-exclusive.deviceclass.resource.k8s.io/devices"] == "0"
    for driver_class in ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"):
        assert on_dra[f"{driver_class}.deviceclass.resource.k8s.io/devices"] == "0"
    untrusted = quota(DRA, "partner-eval")
    assert untrusted["gpushare-notebooks-ts4.deviceclass.resource.k8s.io/devices"] == "0"
    assert untrusted["gpushare-mig-balanced-1g.10gb.deviceclass.resource.k8s.io/devices"] == "8"
    assert tenancy[DRA].device_class_mappings == dra.kueue_device_class_mappings(fleet(), DRA)
    assert tenancy[PLUGIN].device_class_mappings == []


def _all_dra_objects() -> list[dict[str, Any]]:
    f = fleet()
    objects = dra.device_classes(f, DRA)
    for t in f.tenants:
        objects += dra.claim_templates(f, DRA, t)
    objects += [o for o in fleet_tenancy(f, load_guardrails())[DRA].objects if o["kind"] == "ResourceQuota"]
    return objects


@pytest.mark.parametrize("minor", MINORS)
def test_every_dra_object_passes_the_strict_kubernetes_schema(minor: str) -> None:
    objects = _all_dra_objects()
    assert {o["kind"] for o in objects} == {"DeviceClass", "ResourceClaimTemplate", "ResourceQuota"}
    for obj in objects:
        kubernetes_validate.validate(obj, minor, strict=True)


def test_the_schema_check_catches_a_misspelt_claim_field() -> None:
    template = copy.deepcopy(dra.claim_templates(fleet(), DRA, tenant("notebooks"))[0])
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["devceClassName"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(template, "1.34", strict=True)


# ---------------------------------------------------------------- opaque config against the driver's types


def test_every_opaque_config_matches_the_drivers_types() -> None:
    for obj in dra.device_classes(fleet(), DRA):
        for entry in obj["spec"]["config"]:
            assert entry["opaque"]["driver"] == "gpu.nvidia.com"
            assert dra.config_problems(entry["opaque"]["parameters"]) == []


@pytest.mark.parametrize(("parameters", "problem"), [
    ({"kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSliceConfig": {}}}, "unknown field"),
    ({"kind": "GpuConfig", "sharing": {"strategy": "Timeslicing"}}, "not one of TimeSlicing, MPS"),
    ({"kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Fast"}}},
     "not one of Default, Short, Medium, Long"),
    ({"kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}},
     "unknown field 'timeSlicingConfig'"),
    ({"kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}},
     "percentage"),
    ({"kind": "GpuConfig", "sharing": {}}, "missing strategy"),
    ({"kind": "GpuConfiguration"}, "is not one of"),
])
def test_config_check_refuses_what_the_drivers_strict_decoder_refuses(parameters: dict[str, Any],
                                                                       problem: str) -> None:
    problems = dra.config_problems({"apiVersion": "resource.nvidia.com/v1beta1", **parameters})
    assert any(problem in p for p in problems), problems


def test_driver_facts_are_consistent() -> None:
    facts = dra.driver_facts()
    named = {g for pair in facts.mutually_exclusive for g in pair} | set(facts.requires) | set(
        facts.requires.values()) | set(facts.strategies.values()) | {facts.consumable_shares_gate}
    assert named <= set(facts.gates)
    assert facts.default_version in facts.releases
    assert all(gates <= set(facts.gates) for gates in facts.releases.values())
    assert ("DynamicMIG", "MPSSupport") in facts.mutually_exclusive


# ---------------------------------------------------------------- refusals (bad input: file, line, field, fix)


def test_mps_profile_on_a_dra_cluster_is_refused(write_env: Any) -> None:
    d = data()
    pool_named(d, "dra-notebooks")["profile"] = "mps-4"
    problem = only_problem(refused(write_env, d))
    assert "MPS" in problem.message and problem.path.endswith("profile") and "device-plugin cluster" in problem.fix


def test_time_slicing_without_consumable_shares_is_refused(write_env: Any) -> None:
    d = data()
    cluster_named(d, DRA)["dra"]["version"] = "v0.4.1"
    problem = only_problem(refused(write_env, d))
    assert "ConsumableShares" in problem.message and "v0.4.1" in problem.message
    assert problem.path == "pools[5].profile"


def test_unknown_and_too_new_feature_gates_are_refused(write_env: Any) -> None:
    d = data()
    cluster_named(d, DRA)["dra"]["feature_gates"] = ["TimeSlicing"]
    problem = only_problem(refused(write_env, d))
    assert problem.path == "clusters[1].dra.feature_gates[0]" and "TimeSlicingSettings" in problem.fix
    d = data()
    cluster_named(d, DRA)["dra"] = {"version": "v0.4.1", "feature_gates": ["FabricManagerPartitioning"],
                                    "kubernetes_feature_gates": ["DRAPartitionableDevices"]}
    d["pools"] = [p for p in d["pools"] if p["name"] != "dra-notebooks"]
    tenant_named(d, "notebooks")["clusters"] = [PLUGIN]
    problem = only_problem(refused(write_env, d))
    assert "v0.4.1 lacks feature gate FabricManagerPartitioning" in problem.message and "v0.5.0" in problem.fix


def test_gates_are_checked_per_release_not_by_the_drivers_since_annotation() -> None:
    # The driver annotates DRAListTypeAttributes with 0.4, but no v0.4.x release registers it.
    assert dra.driver_facts().gates["DRAListTypeAttributes"].since == (0, 4)
    (problem,) = dra.gate_problems("v0.4.1", ["DRAListTypeAttributes"])
    assert "lacks" in problem[1] and "v0.5.0" in problem[2]
    assert dra.gate_problems("v0.5.0", ["DRAListTypeAttributes"]) == []


def test_gates_the_driver_refuses_together_are_refused(write_env: Any) -> None:
    d = data()
    cluster_named(d, DRA)["dra"]["feature_gates"] = ["MPSSupport"]  # dra-llm runs dynamic MIG
    problem = only_problem(refused(write_env, d))
    assert "DynamicMIG and MPSSupport" in problem.message and problem.path == "clusters[1].dra.feature_gates[0]"


def test_dynamic_mig_on_a_device_plugin_cluster_is_refused(write_env: Any) -> None:
    d = data()
    pool_named(d, "plugin-mig")["mig_mode"] = "dynamic"
    problem = only_problem(refused(write_env, d))
    assert problem.path == "pools[0].mig_mode" and "gpu_allocation: dra" in problem.fix


def test_dynamic_mig_without_a_mig_profile_is_refused(write_env: Any) -> None:
    d = data()
    pool_named(d, "dra-training")["mig_mode"] = "dynamic"
    assert "uses no MIG" in only_problem(refused(write_env, d)).message


def test_dra_below_kubernetes_1_34_is_refused(write_env: Any) -> None:
    d = data()
    cluster_named(d, DRA)["kubernetes_version"] = "1.33"
    problem = only_problem(refused(write_env, d))
    assert "1.34" in problem.message and problem.path.startswith("clusters[1]")


def test_mig_strategy_single_on_a_dra_cluster_is_refused(write_env: Any) -> None:
    # single would name every MIG class nvidia.com/gpu: MIG quotas would match nothing, GPU quotas count slices.
    d = data()
    cluster_named(d, DRA)["mig_strategy"] = "single"
    problem = only_problem(refused(write_env, d))
    assert "mig_strategy single" in problem.message and problem.path.startswith("clusters[1]")
    assert "mixed" in problem.fix


def gate_problems(write_env: Any, d: dict[str, Any]) -> list[Any]:
    """The problems about Kubernetes feature gates (the fixture's dynamic MIG beside time-slicing is also refused
    before 1.36, test_dynamic_mig_beside_time_slicing_needs_1_36)."""
    try:
        resolve(write_env(d), PROFILES)
    except GpushareError as error:
        return [p for p in error.problems if "feature gate" in p.message]
    return []


def test_profiles_need_the_kubernetes_gates_the_cluster_states(write_env: Any) -> None:
    # Before 1.36, without DRAConsumableCapacity and DRAPartitionableDevices the API server drops the fields.
    d = data()
    cluster_named(d, DRA)["kubernetes_version"] = "1.34"
    cluster_named(d, DRA)["dra"]["kubernetes_feature_gates"] = []
    problems = gate_problems(write_env, d)
    assert sorted(p.message.split("Kubernetes' ")[1].split(" ")[0] for p in problems) == [
        "DRAConsumableCapacity", "DRAPartitionableDevices"]
    assert all(p.path == "clusters[1].dra.kubernetes_feature_gates" and p.fix for p in problems)
    cluster_named(d, DRA)["kubernetes_version"] = "1.35"  # still alpha (capacity) and alpha (partitions) in 1.35
    assert len(gate_problems(write_env, d)) == 2
    cluster_named(d, DRA)["dra"]["kubernetes_feature_gates"] = ["DRAConsumableCapacity", "DRAPartitionableDevices"]
    assert gate_problems(write_env, d) == []
    for version in ("1.36", "1.37"):  # both beta, on by default, from 1.36: nothing to state
        cluster_named(d, DRA)["kubernetes_version"] = version
        cluster_named(d, DRA)["dra"]["kubernetes_feature_gates"] = []
        resolve(write_env(d), PROFILES)


def test_dra_block_on_a_device_plugin_cluster_is_refused(write_env: Any) -> None:
    d = data()
    cluster_named(d, PLUGIN)["dra"] = {"version": "v0.5.0"}
    assert "does nothing" in only_problem(refused(write_env, d)).message


def test_unknown_driver_version_is_refused(write_env: Any) -> None:
    d = data()
    cluster_named(d, DRA)["dra"]["version"] = "v0.3.9"
    problem = only_problem(refused(write_env, d))
    assert problem.path == "clusters[1].dra.version" and "v0.5.0" in problem.fix


def test_time_slicing_profiles_must_agree_on_shares(write_env: Any) -> None:
    d = data()
    d["pools"].append({"name": "dra-inference", "cluster": DRA, "purpose": "inference", "gpu_model": "NVIDIA L4",
                       "profile": "inference-ts2", "hosts": [{"name": "dra-l4-01", "address": "10.60.2.41",
                                                              "gpu_count": 2}]})
    problem = only_problem(refused(write_env, d))
    assert "consumable-shares" in problem.message and problem.path == "pools[6].profile"


def test_gpu_cluster_install_with_operator_static_mig_is_refused(write_env: Any) -> None:
    d = data()
    d["clusters"].append({"name": "lab-gke", "kind": "gke", "kubernetes_version": "1.34", "gpu_allocation": "dra",
                          "dra": {"install": "gpu-cluster", "kubernetes_feature_gates": ["DRAPartitionableDevices"]}})
    d["pools"].append({"name": "gke-a100", "cluster": "lab-gke", "purpose": "inference",
                       "gpu_model": "nvidia-a100-80gb", "profile": "mig-balanced",
                       "cloud": {"machine_type": "a2-ultragpu-1g", "gpus_per_node": 1, "node_count": 1}})
    problem = only_problem(refused(write_env, d))
    assert "ClusterPolicy" in problem.message and "dra.install: chart" in problem.fix
    d["pools"][-1]["mig_mode"] = "dynamic"
    resolve(write_env(d), PROFILES)


def test_gke_managed_sharing_on_a_dra_cluster_is_refused(write_env: Any) -> None:
    d = data()
    d["clusters"].append({"name": "lab-gke", "kind": "gke", "kubernetes_version": "1.34", "gpu_allocation": "dra"})
    d["pools"].append({"name": "gke-l4", "cluster": "lab-gke", "purpose": "inference", "gpu_model": "NVIDIA L4",
                       "profile": "exclusive", "cloud": {"machine_type": "g2-standard-24", "gpus_per_node": 2,
                                                         "node_count": 1, "sharing": "gke-managed"}})
    problem = only_problem(refused(write_env, d))
    assert problem.path.endswith("cloud.sharing") and "DRA" in problem.message


def test_validate_exits_1_with_the_reason(write_env: Any) -> None:
    d = data()
    pool_named(d, "dra-notebooks")["profile"] = "mps-4"
    result = CliRunner().invoke(app, ["validate", "--env", str(write_env(d))])
    assert result.exit_code == 1, result.output
    assert "DRA cluster 'lab-dra'" in result.output and "Traceback" not in result.output


def test_alpha_gates_are_named_in_the_warnings() -> None:
    (warning,) = [w for w in fleet().warnings if "alpha" in w]
    assert "ConsumableShares, DynamicMIG, TimeSlicingSettings" in warning and "DRAConsumableCapacity" in warning


def test_kueue_mapping_limits_are_checked() -> None:
    def plan(name: str, resource: str) -> dra.DeviceClassPlan:
        return dra.DeviceClassPlan(name=name, profile=name, kind="mig", instance="1g.10gb", models=("m",),
                                   resource=resource, hardware_isolated=True)

    assert dra.mapping_problems([plan(f"c{i}", f"nvidia.com/r{i}") for i in range(16)]) == []
    (too_many,) = dra.mapping_problems([plan(f"c{i}", f"nvidia.com/r{i}") for i in range(17)])
    assert "at most 16" in too_many[0]
    (crowded,) = dra.mapping_problems([plan(f"c{i}", "nvidia.com/mig-1g.10gb") for i in range(9)])
    assert "at most 8" in crowded[0]


# ---------------------------------------------------------------- any combination: refused cleanly or built valid

_CHOICES: dict[str, list[Any]] = {
    "gpu_allocation": ["dra", "device-plugin"],
    "version": ["v0.4.0", "v0.4.1", "v0.5.0", "v9.9.9", None],
    "install": ["chart", "gpu-cluster"],
    "feature_gates": [[], ["MPSSupport"], ["DynamicMIG"], ["PassthroughSupport"], ["ConsumableShares"], ["Nope"]],
    "kubernetes_version": ["1.33", "1.34", "1.37"],
    "mig_mode": ["static", "dynamic"],
    "profile": ["exclusive", "mig-balanced", "mig-small-ts2", "mps-4", "notebooks-ts4", "inference-ts2"],
}


def _combination(draw: Any) -> dict[str, Any]:
    d = data()
    for c in d["clusters"]:
        c["gpu_allocation"] = draw(st.sampled_from(_CHOICES["gpu_allocation"]))
        c["kubernetes_version"] = draw(st.sampled_from(_CHOICES["kubernetes_version"]))
        c.pop("dra", None)
        if c["gpu_allocation"] == "dra" and draw(st.booleans()):
            c["dra"] = {k: draw(st.sampled_from(_CHOICES[k])) for k in ("version", "install", "feature_gates")}
            c["dra"] = {k: v for k, v in c["dra"].items() if v is not None}
    for p in d["pools"]:
        p["mig_mode"] = draw(st.sampled_from(_CHOICES["mig_mode"]))
        if draw(st.booleans()):
            p["profile"] = draw(st.sampled_from(_CHOICES["profile"]))
    d["tenants"] = [{**t, "quota": {}, "borrowing_limit": {}} for t in d["tenants"]]
    return d


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_dra_combination_is_refused_with_a_fix_or_builds_valid_objects(write_env: Any, drawn: Any) -> None:
    d = _combination(drawn.draw)
    try:
        f = resolve(write_env(d), PROFILES)
    except GpushareError as error:
        assert all(p.fix and p.file for p in error.problems), [str(p) for p in error.problems]
        return
    for cluster in f.clusters:
        dra.feature_gates(f, cluster)  # the resolver already refused what this would
        for obj in dra.device_classes(f, cluster):
            kubernetes_validate.validate(obj, "1.34", strict=True)
            assert dra.config_problems(obj["spec"]["config"][0]["opaque"]["parameters"]) == []
        for t in f.tenants:
            for obj in dra.claim_templates(f, cluster, t):
                kubernetes_validate.validate(obj, "1.34", strict=True)
        assert dra.mapping_problems(dra.class_plans(f, cluster)) == []


# ---------------------------------------------------------------- the rollout's node gate on DRA clusters


def resource_slice(node: str, devices: list[dict[str, str]], driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    """A ResourceSlice as the driver publishes it: attributes unqualified (its own domain) or driver-qualified."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1},
                     "devices": [{"name": f"dev-{i}", "attributes": {k: {"string": v} for k, v in d.items()}}
                                 for i, d in enumerate(devices)]}}


def test_rollout_gate_counts_the_gpus_the_dra_driver_publishes() -> None:
    from gpushare.ops.rollout.execute import published_mismatch

    node = fleet().pool("dra-training").nodes[0]
    eight = resource_slice(node.name, [{"type": "gpu", "productName": "NVIDIA H100 80GB HBM3"}] * 8)
    assert published_mismatch(node, [eight]) == []
    seven = resource_slice(node.name, [{"gpu.nvidia.com/type": "gpu"}] * 7)
    assert published_mismatch(node, [seven]) == ["gpu devices: 7 published (expected 8)"]
    # Another node's slice, or another driver's, counts for nothing.
    assert published_mismatch(node, [resource_slice("elsewhere", [{"type": "gpu"}] * 8),
                                     resource_slice(node.name, [{"type": "gpu"}] * 8, driver="x.example.com")]
                              ) == ["gpu devices: 0 published (expected 8)"]
    # Dynamic MIG: the driver makes instances per claim, so only the GPUs themselves are expected.
    dynamic = fleet().pool("dra-llm").nodes[0]
    assert published_mismatch(dynamic, [resource_slice(dynamic.name, [{"type": "gpu"}] * 8)]) == []


def test_rollout_gate_counts_static_mig_instances_per_profile(write_env: Any) -> None:
    from gpushare.ops.rollout.execute import published_mismatch

    node = resolve(write_env(static_mig(data())), PROFILES).pool("dra-llm").nodes[0]
    assert node.mig_layout == {"4g.40gb": 1, "3g.40gb": 1}
    both = [{"type": "mig", "profile": "4g.40gb"}] * 8 + [{"type": "mig", "profile": "3g.40gb"}] * 8
    assert published_mismatch(node, [resource_slice(node.name, both)]) == []
    whole = resource_slice(node.name, [{"type": "gpu"}] * 8)  # mig-parted has not applied the layout yet
    assert published_mismatch(node, [whole]) == ["MIG 3g.40gb devices: 0 published (expected 8)",
                                                 "MIG 4g.40gb devices: 0 published (expected 8)"]


# ---------------------------------------------------------------- the partitionable shape (issue 38)
# What the real kube-scheduler does with the slices NVIDIA's driver publishes under DynamicMIG and consumable shares
# is shown in tests/cluster/test_dra_partitionable.py; these are the refusals and renderings that follow from it.


def test_dynamic_mig_beside_time_slicing_needs_1_36(write_env: Any) -> None:
    """Before 1.36 the scheduler does not subtract the counters of devices allocated with consumable capacity, and
    the cluster's time-sliced profile puts consumable shares on every device: dynamic MIG would overcommit GPUs."""
    d = data()
    cluster_named(d, DRA)["kubernetes_version"] = "1.35"  # the fixture states both alpha gates
    problem = only_problem(refused(write_env, d))
    assert problem.path == "clusters[1].kubernetes_version" and "overcommits GPUs" in problem.message, problem
    for pool in ("dra-mig", "dra-llm"):  # no dynamic MIG: nothing consumes counters
        pool_named(d, pool)["mig_mode"] = "static"
    resolve(write_env(d), PROFILES)
    for version in ("1.36", "1.37"):
        d = data()
        cluster_named(d, DRA)["kubernetes_version"] = version
        resolve(write_env(d), PROFILES)


def test_time_slicing_on_devices_a_claim_consumes_whole_is_refused(write_env: Any) -> None:
    """The driver gives partitionable full GPUs (Hopper and newer under DynamicMIG) and every MIG device SM and
    engine capacities without a request policy: the first claim consumes them whole, so time-slicing there is
    refused. An Ampere GPU with MIG off, or a GPU without MIG, stays a plain shareable device."""
    d = data()
    pool_named(d, "dra-notebooks")["gpu_model"] = "NVIDIA H100 80GB HBM3"
    problem = only_problem(refused(write_env, d))
    assert problem.path == "pools[5].profile" and "partitionable devices" in problem.message, problem
    pool_named(d, "dra-notebooks")["gpu_model"] = "NVIDIA A100-SXM4-80GB"
    resolve(write_env(d), PROFILES)
    h100 = fleet().pool("dra-llm").nodes[0].gpu_model
    l40s = fleet().pool("dra-notebooks").nodes[0].gpu_model
    assert dra.shares_refusal(h100, "time-slicing", dynamic_mig=False) is None  # no DynamicMIG: memory only
    assert dra.shares_refusal(l40s, "time-slicing", dynamic_mig=True) is None
    for dynamic in (False, True):  # MIG devices carry SM capacities, static or dynamic
        refusal = dra.shares_refusal(h100, "mig-time-slicing", dynamic_mig=dynamic)
        assert refusal is not None and "MIG devices" in refusal[0] and refusal[1]
    assert dra.shares_refusal(h100, "mig", dynamic_mig=True) is None


def test_kueue_counts_time_sliced_claims_by_the_shares_they_consume() -> None:
    """A resource only time-sliced classes count as maps them with a capacity source (`shares` of the driver's
    devices), which needs Kueue's KueueDRAIntegrationConsumableCapacity: gpushare's Kueue values turn it on. MIG and
    exclusive classes, and a resource a time-sliced class shares with another, stay device counts."""
    from gpushare.program.components.tenancy import check_kueue_values, kueue_values

    mappings = {m["name"]: m for m in dra.kueue_device_class_mappings(fleet(), DRA)}
    assert mappings["nvidia.com/gpu.shared"]["sources"] == [{"capacity": {
        "name": "shares", "driver": "gpu.nvidia.com",
        "deviceSelector": {"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}}}]
    assert [n for n, m in mappings.items() if "sources" in m] == ["nvidia.com/gpu.shared"]
    assert dra.kueue_feature_gates(list(mappings.values())) == {"KueueDRAIntegrationConsumableCapacity": True}
    values = kueue_values(fleet(), fleet().clusters[DRA])
    assert values["controllerManager"] == {"featureGates": [
        {"name": "KueueDRAIntegrationConsumableCapacity", "enabled": True}]}
    assert check_kueue_values(values) == []
    assert "controllerManager" not in kueue_values(fleet(), fleet().clusters[PLUGIN])

    def plan(name: str, kind: str) -> dra.DeviceClassPlan:
        return dra.DeviceClassPlan(name=name, profile=name, kind=kind, instance=None, models=("NVIDIA L4",),
                                   resource="nvidia.com/gpu", hardware_isolated=kind == "exclusive")

    (mixed,) = dra.mappings_for_plans([plan("gpushare-ts", "time-slicing"), plan("gpushare-x", "exclusive")])
    assert "sources" not in mixed and dra.kueue_feature_gates([mixed]) == {}
