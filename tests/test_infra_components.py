"""Each Pulumi component under the mock engine, asserting the inputs it registers: GpuNodePool (bare metal, GKE,
EKS), NvidiaStack (operator values, sharing configs, opt-outs and ordering) and Monitoring."""

from __future__ import annotations

import copy
import functools
import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core import spec
from gpushare.core.errors import GpushareError
from gpushare.core.nvidia.operator import effective_device_plugin_env, gpu_operator_chart_values
from gpushare.core.resolve import resolve, resolve_env
from gpushare.ops.preview import Plan, PlannedResource, collect_plan
from gpushare.policy.device_plugin import settings_problems
from gpushare.program.components import operator_values as ov
from gpushare.render.fleet import render_fleet
from tests.conftest import ENVIRONMENTS, PROFILES, ROOT, WORKSPACE, pool_named

FIXTURES = ROOT / "tests" / "data" / "infra"
GKE = {"gpushare:monitoring": {"mode": "install"},
       "gpushare:clusters": {"test-gke": {"kubeconfigContext": "gke-test", "gke": {
           "project": "p", "location": "europe-west4", "cluster": "test",
           "driverInstallerManifest": "https://mirror.example/nvidia-driver-installer/cos/daemonset-preloaded.yaml"}}}}
EKS = {"gpushare:monitoring": {"mode": "existing"},
       "gpushare:clusters": {"test-eks": {"kubeconfigContext": "eks-test", "eks": {
           "cluster": "test", "nodeRoleArn": "arn:aws:iam::123456789012:role/gpu-nodes", "subnetIds": ["subnet-1"]}}}}
TAINTS = {"gpushare:monitoring": {"mode": "install"}}


@functools.cache
def shipped(env: str) -> Plan:
    """A frozen fixture stack's plan, collected once per test session (tests only read it)."""
    return collect_plan(env)


def plan_of(env_file: Path | str, extra: dict[str, Any] | None = None, stack: str = "test") -> Plan:
    config = {"gpushare:environment": str(env_file), **(extra or {})}
    return collect_plan(stack, config)


def dev_config(**changes: Any) -> dict[str, Any]:
    config = dict(yaml.safe_load((WORKSPACE / "Pulumi.dev.yaml").read_text())["config"])
    config.update({f"gpushare:{k}": v for k, v in changes.items()})
    return config


def operator_release(plan: Plan, cluster: str | None = None) -> PlannedResource:
    (release,) = [r for r in plan.of_type("helm.sh/v3:Release") if r.inputs["chart"] == "gpu-operator"
                  and (cluster is None or plan.cluster_of(r) == cluster)]
    return release


def env_of(values: dict[str, Any], section: str) -> dict[str, str]:
    return {e["name"]: e["value"] for e in values[section].get("env", [])}


def by_name(plan: Plan, suffix: str) -> dict[str, PlannedResource]:
    return {r.name: r for r in plan.of_type(suffix)}


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


def test_all_ansible_cluster_turns_driver_toolkit_and_mig_manager_off_and_reads_host_dcgm() -> None:
    values = operator_release(shipped("dev")).inputs["values"]
    assert values["driver"] == {"enabled": False}
    assert values["toolkit"] == {"enabled": False}
    assert values["migManager"] == {"enabled": False}
    assert values["dcgm"] == {"enabled": False}
    assert env_of(values, "dcgmExporter")["DCGM_REMOTE_HOSTENGINE_INFO"] == "localhost:5555"
    # The operator applies dcgmExporter.env after deciding hostNetwork, so it must be set explicitly.
    assert values["dcgmExporter"]["hostNetwork"] is True
    assert values["mig"] == {"strategy": "mixed"} and values["cdi"] == {"enabled": True}


def test_operator_release_comes_after_every_node_patch_and_its_configs() -> None:
    plan = shipped("pilot")
    release = operator_release(plan, "pilot-metal")
    patches = [r.urn for r in plan.of_type(":NodePatch")]
    assert len(patches) == 6 and set(patches) <= set(release.dependencies)
    configmaps = {r.inputs["metadata"]["name"]: r.urn for r in plan.of_type(":ConfigMap")
                  if plan.cluster_of(r) == "pilot-metal" and r.inputs["metadata"]["namespace"] == "gpu-operator"}
    assert set(configmaps.values()) <= set(release.dependencies)


MIXED_PROGRAM = textwrap.dedent('''
    """Test program: the dev fleet with its L4 host handed to the GPU Operator, so its cluster mixes both."""
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, {root!r})
    import pulumi
    from gpushare.core.guardrails import load_guardrails
    from gpushare.core.labels import DEVICE_PLUGIN_CONFIG_LABEL, Label
    from gpushare.core.resolve import resolve
    from gpushare.program.program import plan_cluster, register_cluster
    from gpushare.program.stack_config import load_stack_config

    fleet = resolve(Path({env!r}))
    pool = fleet.pool("l4-notebooks")
    node = pool.nodes[0]
    labels = dict(node.labels)
    labels[DEVICE_PLUGIN_CONFIG_LABEL] = Label(node.device_plugin_config, "pulumi")
    pool.nodes[0] = dataclasses.replace(node, managed_by="gpu-operator", labels=labels)
    stack = load_stack_config()
    for cluster in fleet.clusters.values():
        register_cluster(fleet, plan_cluster(fleet, cluster, stack, load_guardrails(), {{}}))
''')


@pytest.fixture(scope="module")
def mixed_plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    program = tmp_path_factory.mktemp("mixed") / "program.py"
    program.write_text(MIXED_PROGRAM.format(root=str(ROOT), env=str(ENVIRONMENTS / "dev.yaml")))
    return collect_plan("dev", dev_config(), program=program)


def test_mixed_cluster_opts_ansible_hosts_out_before_the_operator(mixed_plan: Plan) -> None:
    patches = {r.inputs["metadata"]["name"]: r for r in mixed_plan.of_type(":NodePatch")}
    opt_outs = {f"nvidia.com/gpu.deploy.{o}": "false"
                for o in ("driver", "container-toolkit", "mig-manager", "dcgm-exporter")}
    for host in ("dev-a100-01", "dev-h100-01"):
        assert opt_outs.items() <= patches[host].inputs["metadata"]["labels"].items()
        assert patches[host].inputs["metadata"]["annotations"] == {"pulumi.com/patchForce": "true"}
    operator_host = patches["dev-l4-01"].inputs["metadata"]["labels"]
    assert not set(opt_outs) & set(operator_host)
    assert operator_host["nvidia.com/device-plugin.config"].startswith("notebooks-ts4-")
    release = operator_release(mixed_plan)
    assert {p.urn for p in patches.values()} <= set(release.dependencies)
    values = release.inputs["values"]
    # The operator-managed host needs the driver and toolkit operands; the cluster-wide switches stay on.
    assert values["driver"]["enabled"] and values["toolkit"]["enabled"]
    assert env_of(values, "toolkit") == {"ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED": "false",
                                         "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS": "true"}
    assert "DCGM_REMOTE_HOSTENGINE_INFO" not in env_of(values, "dcgmExporter")
    assert any("NVIDIA_CDI_HOOK_PATH=/usr/local/nvidia/toolkit/nvidia-cdi-hook" in w for w in mixed_plan.warnings)


def test_mixed_cluster_runs_a_host_network_exporter_on_hosts_with_their_own_dcgm(mixed_plan: Plan) -> None:
    (daemonset,) = mixed_plan.of_type("apps/v1:DaemonSet")
    pod = daemonset.inputs["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.dcgm-exporter": "false"}
    assert pod["hostNetwork"] is True
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["DCGM_REMOTE_HOSTENGINE_INFO"] == "localhost:5555"
    assert env["KUBERNETES_VIRTUAL_GPUS"] == "true"  # the L4 and MIG hosts time-slice: per-pod series
    values = operator_release(mixed_plan).inputs["values"]
    assert pod["tolerations"] == values["daemonsets"]["tolerations"]
    (monitor,) = mixed_plan.of_type(":ServiceMonitor")
    assert monitor.inputs["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_host_opt_outs_only_where_a_cluster_mixes_both() -> None:
    from gpushare.core.resolve import host_opt_outs

    fleet = resolve_env("dev")
    assert host_opt_outs(fleet.nodes) == {}
    import dataclasses

    nodes = [*fleet.nodes[:2], dataclasses.replace(fleet.nodes[2], managed_by="gpu-operator")]
    found = host_opt_outs(nodes)
    assert set(found) == {fleet.nodes[0].name, fleet.nodes[1].name}
    assert found[fleet.nodes[0].name]["nvidia.com/gpu.deploy.mig-manager"] == "false"


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


# ---------------------------------------------------------------- NvidiaStack values


def test_every_pool_taint_is_tolerated_by_operands_and_node_feature_discovery() -> None:
    fleet = resolve(FIXTURES / "taints.yaml")
    taints = [t for n in fleet.nodes for t in n.taints]
    assert {t.effect for t in taints} == {"NoSchedule", "PreferNoSchedule", "NoExecute"}
    values = operator_release(plan_of(FIXTURES / "taints.yaml", TAINTS)).inputs["values"]
    assert ov.untolerated(taints, values["daemonsets"]["tolerations"]) == []
    assert ov.untolerated(taints, values["node-feature-discovery"]["worker"]["tolerations"]) == []
    # The chart's own defaults would leave the pool taints untolerated.
    defaults = gpu_operator_chart_values()
    assert ov.untolerated(taints, defaults["daemonsets"]["tolerations"])
    assert ov.untolerated(taints, defaults["node-feature-discovery"]["worker"]["tolerations"])


@pytest.mark.parametrize(("toleration", "taint", "expected"), [
    ({"key": "a", "operator": "Exists", "effect": "NoSchedule"}, ("a", "x", "NoSchedule"), True),
    ({"key": "a", "operator": "Exists"}, ("a", "", "NoExecute"), True),
    ({"key": "a", "operator": "Equal", "value": "x", "effect": "NoSchedule"}, ("a", "y", "NoSchedule"), False),
    ({"key": "a", "operator": "Equal", "value": "x", "effect": "NoSchedule"}, ("a", "x", "NoExecute"), False),
    ({"operator": "Exists"}, ("anything", "v", "NoExecute"), True),
    ({"key": "b", "operator": "Exists"}, ("a", "", "NoSchedule"), False),
])
def test_toleration_matching_follows_kubernetes(toleration: dict[str, str], taint: tuple[str, str, str],
                                                expected: bool) -> None:
    key, value, effect = taint
    assert ov.tolerates(toleration, spec.Taint(key=key, value=value, effect=effect)) is expected  # type: ignore[arg-type]


def test_without_cdi_the_device_list_strategy_is_volume_mounts_never_envvar() -> None:
    values = operator_release(plan_of(FIXTURES / "taints.yaml", TAINTS)).inputs["values"]
    assert values["cdi"] == {"enabled": False} and values["mig"] == {"strategy": "single"}
    effective = effective_device_plugin_env(values)
    assert effective["DEVICE_LIST_STRATEGY"] == "volume-mounts"
    assert effective["MIG_STRATEGY"] == "single"
    # Left to the operator, the plugin would run with its asset default: envvar.
    bare = {k: v for k, v in values.items() if k != "devicePlugin"}
    assert effective_device_plugin_env(bare)["DEVICE_LIST_STRATEGY"] == "envvar"
    cluster = spec.Cluster(name="lab", kind="bare-metal", kubernetes_version="1.33", mig_strategy="single",
                           cdi=False)
    assert any("envvar" in p for p in settings_problems(bare, cluster))


def test_cdi_cluster_effective_settings_match_the_configs() -> None:
    values = operator_release(shipped("dev")).inputs["values"]
    effective = effective_device_plugin_env(values)
    assert effective["DEVICE_LIST_STRATEGY"] == "cdi-annotations,cdi-cri" and effective["MIG_STRATEGY"] == "mixed"
    cluster = resolve_env("dev").clusters["dev-metal"]
    assert settings_problems(values, cluster) == []
    wrong = copy.deepcopy(values)
    wrong["mig"]["strategy"] = "single"
    assert any("MIG_STRATEGY" in p for p in settings_problems(wrong, cluster))


def plugin_hash(plan: Plan) -> str:
    return env_of(operator_release(plan).inputs["values"], "devicePlugin")[ov.DEVICE_PLUGIN_HASH_ENV]


def test_a_changed_sharing_config_changes_the_plugins_hash(write_env: Callable[..., Path]) -> None:
    data = yaml.safe_load((ENVIRONMENTS / "dev.yaml").read_text())
    before = plugin_hash(collect_plan("dev", dev_config(environment=str(write_env(data, "a/dev.yaml")))))
    assert before == plugin_hash(shipped("dev"))  # same fleet, same hash
    data["profiles"] = [{"name": "notebooks-ts8", "kind": "time-slicing", "time_slicing": {"replicas": 8}}]
    pool_named(data, "l4-notebooks")["profile"] = "notebooks-ts8"
    data["tenants"] = [t for t in data["tenants"] if "nvidia.com/gpu.shared" not in t["quota"]]
    after_plan = collect_plan("dev", dev_config(environment=str(write_env(data, "b/dev.yaml"))))
    assert plugin_hash(after_plan) != before
    (cm,) = [r for r in after_plan.of_type(":ConfigMap") if r.inputs["metadata"]["name"] == ov.DEVICE_PLUGIN_CONFIGMAP]
    assert any(k.startswith("notebooks-ts8-") for k in cm.inputs["data"])


def test_device_plugin_configmap_has_every_config_nodes_reference_and_a_safe_default() -> None:
    plan = shipped("pilot")
    fleet = resolve_env("pilot")
    (cm,) = [r for r in plan.of_type(":ConfigMap") if plan.cluster_of(r) == "pilot-metal"
             and r.inputs["metadata"]["name"] == ov.DEVICE_PLUGIN_CONFIGMAP]
    wanted = {n.device_plugin_config for n in fleet.nodes if n.cluster == "pilot-metal"}
    assert set(cm.inputs["data"]) == wanted | {ov.DEFAULT_DEVICE_PLUGIN_CONFIG}
    default = yaml.safe_load(cm.inputs["data"][ov.DEFAULT_DEVICE_PLUGIN_CONFIG])
    assert "sharing" not in default  # whole GPUs for a node without a config label
    values = operator_release(plan, "pilot-metal").inputs["values"]
    assert values["devicePlugin"]["config"] == {"create": False, "name": ov.DEVICE_PLUGIN_CONFIGMAP,
                                                "default": ov.DEFAULT_DEVICE_PLUGIN_CONFIG}


def test_kept_configs_stay_in_the_configmap_until_a_later_up(tmp_path: Path,
                                                            write_env: Callable[..., Path]) -> None:
    # Render today's fleet (what nodes run), then change the L4 profile: the old config is kept from its file.
    old = render_fleet(resolve_env("dev"))
    (name,) = [f.removeprefix("device-plugin/").removesuffix(".yaml") for f in old.files
               if f.startswith("device-plugin/notebooks-ts4-")]
    (tmp_path / "old.yaml").write_text(old.files[f"device-plugin/{name}.yaml"])
    data = yaml.safe_load((ENVIRONMENTS / "dev.yaml").read_text())
    data["profiles"] = [{"name": "notebooks-ts8", "kind": "time-slicing", "time_slicing": {"replicas": 8}}]
    pool_named(data, "l4-notebooks")["profile"] = "notebooks-ts8"
    data["tenants"] = [t for t in data["tenants"] if "nvidia.com/gpu.shared" not in t["quota"]]
    env = str(write_env(data))

    def configs(keep: list[Any]) -> set[str]:
        plan = collect_plan("dev", dev_config(environment=env, keepDevicePluginConfigs=keep))
        (cm,) = [r for r in plan.of_type(":ConfigMap") if r.inputs["metadata"]["name"] == ov.DEVICE_PLUGIN_CONFIGMAP]
        return set(cm.inputs["data"])

    assert name not in configs([])
    assert name in configs([{"name": name, "file": str(tmp_path / "old.yaml")}])
    with pytest.raises(GpushareError, match="not in the environment any more"):
        configs([name])
    (tmp_path / "other.yaml").write_text(old.files[next(f for f in old.files if f.startswith("device-plugin/mig-"))])
    with pytest.raises(GpushareError, match="does not hold config"):
        configs([{"name": name, "file": str(tmp_path / "other.yaml")}])


def test_every_values_key_exists_in_the_pinned_chart() -> None:
    for env in ("dev", "pilot", "prod"):
        plan = shipped(env)
        for release in plan.of_type("helm.sh/v3:Release"):
            if release.inputs["chart"] == "gpu-operator":
                assert release.inputs["version"] == "v26.7.0"
                assert release.inputs["repositoryOpts"] == {"repo": "https://helm.ngc.nvidia.com/nvidia"}
                assert release.inputs["name"] == "gpu-operator"
                assert ov.check_chart_values(release.inputs["values"]) == []


def test_a_values_key_the_pinned_chart_does_not_know_is_refused() -> None:
    with pytest.raises(GpushareError, match=r"GPU Operator v26\.7\.0 has no value 'devicePlugin\.confg'"):
        collect_plan("dev", dev_config(operatorValues={"devicePlugin": {"confg": {"name": "x"}}}))
    assert ov.unknown_chart_keys({"driver": {"repository": "mirror"}, "cdi": {"default": True},
                                  "daemonsets": {"labels": {"any/label": "x"}}}) == []
    assert ov.unknown_chart_keys({"toolkit": {"env": [{"name": "A", "vaule": "1"}]}}) == ["toolkit.env[0].vaule"]


def test_site_values_add_to_ours_but_cannot_undo_them() -> None:
    plan = collect_plan("dev", dev_config(operatorValues={"validator": {"repository": "mirror.example/nvidia"},
                                                          "devicePlugin": {"repository": "mirror.example/nvidia"}}))
    values = operator_release(plan).inputs["values"]
    assert values["validator"] == {"repository": "mirror.example/nvidia"}
    assert values["devicePlugin"]["repository"] == "mirror.example/nvidia"
    with pytest.raises(GpushareError, match="gpushare:operatorValues sets 'devicePlugin.env'"):
        collect_plan("dev", dev_config(operatorValues={"devicePlugin": {"env": []}}))
    with pytest.raises(GpushareError, match="priorityClassName"):
        collect_plan("dev", dev_config(operatorValues={"daemonsets": {"priorityClassName": 5}}))


def test_dcgm_exporter_gets_gpushares_counters_and_monitor_label() -> None:
    plan = shipped("dev")
    values = operator_release(plan).inputs["values"]
    assert values["dcgmExporter"]["config"] == {"name": ov.DCGM_COUNTERS_CONFIGMAP}
    assert values["dcgmExporter"]["serviceMonitor"]["additionalLabels"] == {"release": "kube-prometheus-stack"}
    assert values["dcgmExporter"]["serviceMonitor"]["honorLabels"] is True  # the rules read the exporter's pod label
    (cm,) = [r for r in plan.of_type(":ConfigMap") if r.inputs["metadata"]["name"] == ov.DCGM_COUNTERS_CONFIGMAP]
    assert "DCGM_FI_DEV_GPU_UTIL" in cm.inputs["data"][ov.DCGM_COUNTERS_KEY]


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


def test_cloud_pools_without_their_provider_package_fail_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "pulumi_aws" else real(name, *args))
    with pytest.raises(GpushareError, match=r"EKS pools need the pulumi-aws package.*\[cloud\]"):
        plan_of(FIXTURES / "eks.yaml", EKS)
