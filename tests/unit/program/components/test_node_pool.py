"""GpuNodePool under the Pulumi mock engine, asserting the inputs it registers: a node patch per bare-metal host,
GKE node pools (time-sharing, MPS and MIG partitions, zones, the driver installer) and EKS node groups."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.errors import GpushareError
from gpushare.core.resolve import resolve, resolve_env
from gpushare.ops.preview import Plan
from gpushare.program.components import operator_values as ov
from tests.conftest import PROFILES, pool_named
from tests.unit.program.helpers import (
    EKS,
    FIXTURES,
    GKE,
    env_of,
    operator_release,
    plan_of,
    shipped,
)

# ---------------------------------------------------------------- bare metal


def test_a_node_patch_per_host_with_exactly_the_labels_pulumi_owns_and_the_pool_taints() -> None:
    plan = shipped("dev")
    fleet = resolve_env("dev")
    patches = {r.inputs["metadata"]["name"]: r for r in plan.of_type(":NodePatch")}
    assert set(patches) == {n.name for n in fleet.nodes}
    for node in fleet.nodes:
        inputs = patches[node.name].inputs
        assert inputs["kind"] == "Node" and inputs["apiVersion"] == "v1"
        assert inputs["metadata"]["labels"] == node.labels_owned_by("pulumi")
        # Ansible's labels stay Ansible's: never in a patch.
        assert not set(inputs["metadata"]["labels"]) & set(node.labels_owned_by("ansible"))
        if node.taints:
            assert inputs["spec"]["taints"] == [t.model_dump() for t in node.taints]
            assert inputs["metadata"]["annotations"] == {"pulumi.com/patchForce": "true"}
        else:
            assert "spec" not in inputs  # taints are an atomic list: a pool without taints claims none
            assert "annotations" not in inputs["metadata"]  # and nothing another manager owns
        assert patches[node.name].provider and plan.cluster_of(patches[node.name]) == "dev-metal"


# ---------------------------------------------------------------- GKE


@pytest.fixture(scope="module")
def gke_plan() -> Plan:
    return plan_of(FIXTURES / "gke-operator.yaml", GKE)


def node_pools(plan: Plan) -> dict[str, dict[str, Any]]:
    return {r.inputs["namePrefix"].rstrip("-"): r.inputs for r in plan.of_type("container/nodePool:NodePool")}


def test_gke_managed_time_sharing_carries_the_profiles_replicas_and_the_shared_taint() -> None:
    plan = shipped("pilot")
    (pool,) = node_pools(plan).values()
    (acc,) = pool["nodeConfig"]["guestAccelerators"]
    profile = yaml.safe_load((PROFILES / "inference-ts2.yaml").read_text())
    assert acc["gpuSharingConfig"] == {"gpuSharingStrategy": "TIME_SHARING",
                                       "maxSharedClientsPerGpu": profile["time_slicing"]["replicas"]}
    assert acc["type"] == "nvidia-l4" and acc["count"] == 2
    assert pool["nodeConfig"]["labels"]["nvidia.com/gpu.deploy.operands"] == "false"
    assert {"key": "gpushare.io/shared-gpu", "value": "true", "effect": "NO_SCHEDULE"} in pool["nodeConfig"]["taints"]
    # GKE counts nodes per zone; the environment's counts are totals.
    assert pool["autoscaling"] == {"totalMinNodeCount": 1, "totalMaxNodeCount": 4, "locationPolicy": "BALANCED"}
    prod = node_pools(shipped("prod"))["gke-l4-inference"]
    assert prod["initialNodeCount"] == 2 and prod["nodeLocations"] == ["europe-west4-a", "europe-west4-b"]


def test_gke_managed_mps_and_mig_partitions(gke_plan: Plan) -> None:
    pools = node_pools(gke_plan)
    (mps,) = pools["l4-gke-mps"]["nodeConfig"]["guestAccelerators"]
    assert mps["gpuSharingConfig"] == {"gpuSharingStrategy": "MPS", "maxSharedClientsPerGpu": 4}
    (mig,) = pools["a100-gke-mig"]["nodeConfig"]["guestAccelerators"]
    assert mig["gpuPartitionSize"] == "1g.10gb" and "gpuSharingConfig" not in mig
    assert mig["gpuDriverInstallationConfig"] == {"gpuDriverVersion": "DEFAULT"}
    assert pools["a100-gke-mig"]["nodeCount"] == 1  # 2 nodes over 2 zones


def test_operator_managed_gke_pool_opts_out_of_gkes_plugin_and_driver(gke_plan: Plan) -> None:
    pool = node_pools(gke_plan)["a100-operator"]
    labels = pool["nodeConfig"]["labels"]
    assert labels["gke-no-default-nvidia-gpu-device-plugin"] == "true"
    assert labels["nvidia.com/mig.config"].startswith("mig-balanced-")
    assert labels["nvidia.com/device-plugin.config"].startswith("mig-balanced-")
    (acc,) = pool["nodeConfig"]["guestAccelerators"]
    assert acc["gpuDriverInstallationConfig"] == {"gpuDriverVersion": "INSTALLATION_DISABLED"}
    assert "gpuSharingConfig" not in acc and "gpuPartitionSize" not in acc
    values = operator_release(gke_plan).inputs["values"]
    assert values["driver"] == {"enabled": False}
    assert values["hostPaths"] == {"driverInstallDir": "/home/kubernetes/bin/nvidia"}
    assert values["toolkit"]["enabled"] and values["toolkit"]["installDir"] == "/home/kubernetes/bin/nvidia"
    assert env_of(values, "toolkit")["ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"] == "false"
    assert values["migManager"]["enabled"] and values["migManager"]["config"]["name"] == ov.MIG_PARTED_CONFIGMAP
    assert env_of(values, "migManager")["WITH_REBOOT"] == "true"


def test_gke_cluster_gets_the_priority_quota_and_the_driver_installer_before_the_operator(gke_plan: Plan) -> None:
    release = operator_release(gke_plan)
    (quota,) = gke_plan.of_type(":ResourceQuota")
    (installer,) = gke_plan.of_type("yaml/v2:ConfigFile")
    assert installer.inputs["file"].endswith("daemonset-preloaded.yaml")
    assert {quota.urn, installer.urn} <= set(release.dependencies)
    assert quota.inputs["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == [
        "system-node-critical", "system-cluster-critical"]
    # Cloud node pools come after the NVIDIA stack (the order of docs/rollout.md).
    for pool in gke_plan.of_type("container/nodePool:NodePool"):
        assert release.urn in pool.dependencies


def test_mig_manager_configmap_holds_our_configs_for_operator_managed_nodes(gke_plan: Plan) -> None:
    (cm,) = [r for r in gke_plan.of_type(":ConfigMap") if r.inputs["metadata"]["name"] == ov.MIG_PARTED_CONFIGMAP]
    config = yaml.safe_load(cm.inputs["data"]["config.yaml"])
    fleet = resolve(FIXTURES / "gke-operator.yaml")
    operator_configs = {n.mig_config for n in fleet.nodes if n.managed_by == "gpu-operator"}
    assert set(config["mig-configs"]) == {"all-disabled", *operator_configs}
    # GKE-managed MIG nodes are GKE's: their config is not ours to apply.
    gke_configs = {n.mig_config for n in fleet.nodes if n.managed_by == "gke"} - operator_configs
    assert gke_configs and not gke_configs & set(config["mig-configs"])


def test_operator_managed_gke_pool_needs_the_driver_installer() -> None:
    config = copy.deepcopy(GKE)
    del config["gpushare:clusters"]["test-gke"]["gke"]["driverInstallerManifest"]
    with pytest.raises(GpushareError, match="driver-installer DaemonSet"):
        plan_of(FIXTURES / "gke-operator.yaml", config)


@pytest.mark.parametrize(("profile", "message"), [
    ({"name": "mig-four", "kind": "mig", "mig": {"layouts": {"NVIDIA A100-SXM4-80GB": "1g.10gb=4"}}},
     "GKE's gpu_partition_size always creates 7"),
    ({"name": "mig-me", "kind": "mig", "mig": {"layouts": {"NVIDIA A100-SXM4-80GB": "1g.10gb+me=1"}}},
     "has no GKE partition size"),
    ({"name": "ts-64", "kind": "time-slicing", "time_slicing": {"replicas": 64}}, "above GKE's limit of 48"),
])
def test_a_profile_gke_cannot_express_is_refused(profile: dict[str, Any], message: str,
                                                 write_env: Callable[..., Path]) -> None:
    data = yaml.safe_load((FIXTURES / "gke-operator.yaml").read_text())
    data["profiles"] = [profile]
    pool_named(data, "a100-gke-mig")["profile"] = profile["name"]
    with pytest.raises(GpushareError, match=message):
        plan_of(write_env(data), GKE)


def test_gke_node_counts_must_spread_evenly_over_zones(write_env: Callable[..., Path]) -> None:
    data = yaml.safe_load((FIXTURES / "gke-operator.yaml").read_text())
    pool_named(data, "a100-gke-mig")["cloud"]["node_count"] = 3
    with pytest.raises(GpushareError, match="cannot be spread evenly over 2 zones"):
        plan_of(write_env(data), GKE)


# ---------------------------------------------------------------- EKS


@pytest.fixture(scope="module")
def eks_plan() -> Plan:
    return plan_of(FIXTURES / "eks.yaml", EKS)


def test_eks_node_groups_use_the_nvidia_ami_and_opt_out_of_its_operands(eks_plan: Plan) -> None:
    groups = {r.inputs["tags"]["gpushare.io/pool"]: r for r in eks_plan.of_type("eks/nodeGroup:NodeGroup")}
    h100 = groups["h100-mig"].inputs
    assert h100["amiType"] == "AL2023_x86_64_NVIDIA" and h100["instanceTypes"] == ["p5.48xlarge"]
    assert h100["clusterName"] == "test" and h100["subnetIds"] == ["subnet-1"]
    assert h100["scalingConfig"] == {"desiredSize": 2, "minSize": 1, "maxSize": 4}
    assert h100["labels"]["nvidia.com/gpu.deploy.driver"] == "false"
    assert h100["labels"]["nvidia.com/gpu.deploy.container-toolkit"] == "false"
    assert h100["labels"]["nvidia.com/mig.config"].startswith("mig-small-")
    assert h100["taints"] == [{"key": "gpushare.io/pool", "value": "h100-mig", "effect": "NO_SCHEDULE"}]
    # the pool's own taint, and the shared-GPU taint every time-sliced or MPS node carries
    assert groups["l4-notebooks"].inputs["taints"] == [
        {"key": "dedicated", "effect": "NO_EXECUTE"},
        {"key": "gpushare.io/shared-gpu", "value": "true", "effect": "NO_SCHEDULE"}]
    values = operator_release(eks_plan).inputs["values"]
    assert values["driver"] == {"enabled": False} and values["toolkit"] == {"enabled": False}
    assert values["migManager"]["enabled"] is True
    release = operator_release(eks_plan)
    for group in groups.values():
        assert release.urn in group.dependencies
    assert any("EKS NVIDIA AMI configures its own container toolkit" in w for w in eks_plan.warnings)


def test_an_eks_cluster_needs_its_cloud_settings() -> None:
    config = copy.deepcopy(EKS)
    del config["gpushare:clusters"]["test-eks"]["eks"]
    with pytest.raises(GpushareError, match="EKS cluster 'test-eks' needs its name, node role and subnets"):
        plan_of(FIXTURES / "eks.yaml", config)


def test_cloud_pools_without_their_provider_package_fail_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "pulumi_aws" else real(name, *args))
    with pytest.raises(GpushareError, match=r"EKS pools need the pulumi-aws package.*\[cloud\]"):
        plan_of(FIXTURES / "eks.yaml", EKS)
