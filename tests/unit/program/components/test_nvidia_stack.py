"""NvidiaStack under the Pulumi mock engine, asserting the inputs it registers: the GPU Operator's values (hosts
Ansible owns, opt-outs and ordering, a cluster mixing both), sharing configs, tolerations, the device list strategy,
the pinned chart's keys and site values, and dcgm-exporter's counters."""

from __future__ import annotations

import copy
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
from gpushare.ops.preview import Plan, collect_plan
from gpushare.policy.device_plugin import settings_problems
from gpushare.program.components import operator_values as ov
from gpushare.render.fleet import render_fleet
from tests.conftest import ENVIRONMENTS, ROOT, pool_named
from tests.unit.program.helpers import (
    FIXTURES,
    TAINTS,
    dev_config,
    env_of,
    operator_release,
    plan_of,
    shipped,
)


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
