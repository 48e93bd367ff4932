"""`gpushare import` (gpushare.ops.brownfield.importer): every fixture cluster imports to a workspace that
validates and round-trips through `render` (same MIG layout and same advertised resources per node as the source),
with nothing dropped silently. It reads what the GPU Operator hands its operands, nothing else: the mig-parted
ConfigMap the ClusterPolicy names (NVIDIA's default one where it names none), the device plugin's configs as they
act on each node, dumps with several YAML documents; and it reports every operator setting the first rollout
changes."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.cli.init import write_workspace
from gpushare.core.errors import GpushareError
from gpushare.core.resolve import resolve_env
from gpushare.ops.brownfield.cluster import ClusterState, read_dumps
from gpushare.ops.brownfield.importer import ImportResult, import_cluster
from gpushare.render.fleet import parse_device_plugin, parse_mig_parted, render_fleet
from tests.unit.ops.brownfield.helpers import CLUSTERS, ENV, FIXTURES, cli

Imported = Callable[[str], tuple[Path, dict[str, Any]]]
# Nodes whose allocatable does not show what their labels ask for: planted drift, not a round-trip case. The import
# names each of them (status.allocatable), and no other node.
NOT_SETTLED = {"timeslicing-mig": {"a100-02"}, "not-taken-effect": {"l4-12"}}


def source_objects(name: str, kind: str) -> list[dict[str, Any]]:
    """The fixture's objects of one kind, read independently of the importer (any file, List or single objects)."""
    out: list[dict[str, Any]] = []
    for path in sorted((CLUSTERS / name).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            items = doc.get("items", []) if doc.get("kind") == "List" else [doc]
            out += [i for i in items if i.get("kind") == kind]
    return out


def source_nodes(name: str) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in source_objects(name, "Node")
            if "nvidia.com/gpu.count" in n["metadata"]["labels"]}


def source_mig_configs(name: str) -> dict[str, dict[str, dict[str, int]]]:
    """The configs mig-manager reads: the ConfigMap spec.migManager.config.name names (NVIDIA's default one where
    it is unset), parsed by gpushare's own mig-parted parser (not the importer's)."""
    spec = source_objects(name, "ClusterPolicy")[0]["spec"]
    wanted = (spec.get("migManager", {}).get("config") or {}).get("name") or "default-mig-parted-config"
    for cm in source_objects(name, "ConfigMap"):
        if cm["metadata"]["name"] == wanted:
            return parse_mig_parted(cm["data"]["config.yaml"])
    return {}


@pytest.mark.parametrize("name", FIXTURES)
def test_import_round_trips_layouts_and_advertised_resources(imported: Imported, name: str) -> None:
    workspace, out = imported(name)
    code, valid = cli("validate", "--env", ENV)
    assert code == 0, valid
    fleet = resolve_env(ENV)
    rendered = render_fleet(fleet)
    rendered_mig = parse_mig_parted(rendered.files["mig-parted/config.yaml"])
    mig_sources = source_mig_configs(name)
    sources = source_nodes(name)
    assert sorted(n.name for n in fleet.nodes) == sorted(sources)
    for node in fleet.nodes:
        src = sources[node.name]
        labels = src["metadata"]["labels"]
        wanted = mig_sources.get(labels.get("nvidia.com/mig.config", "all-disabled"), {}).get(node.gpu_model.name)
        got = rendered_mig[node.mig_config].get(node.gpu_model.name) if node.mig_config else None
        assert (got or None) == (wanted or None), node.name
        assert node.address == src["status"]["addresses"][0]["address"]
        content = parse_device_plugin(rendered.files[f"device-plugin/{node.device_plugin_config}.yaml"])
        assert content["flags"]["migStrategy"] == fleet.clusters[ENV].mig_strategy
        if node.name in NOT_SETTLED.get(name, set()):
            continue
        allocatable = {k: int(v) for k, v in src["status"]["allocatable"].items() if k.startswith("nvidia.com/")}
        assert node.advertised == allocatable, node.name
    # Where a node allocates other than the plan, the import says so, naming the node.
    told = {u["object"].removeprefix("Node/") for u in out["unsupported"] if u["field"] == "status.allocatable"}
    assert told == NOT_SETTLED.get(name, set())
    # Every config a node uses is in the mapping (all-disabled too), and each rendered config is named after the
    # profile the mapping gives (all-disabled is rendered under its own name).
    for node_name, src in sources.items():
        mig = src["metadata"]["labels"].get("nvidia.com/mig.config")
        if mig and src["metadata"]["labels"].get("nvidia.com/mig.capable") == "true":
            assert f"mig.config={mig}" in out["mapping"], node_name
    for source, rendered_names in out["configs"].items():
        profiles = out["mapping"][source]
        assert all(r == "all-disabled" or any(r.startswith(p) for p in profiles) for r in rendered_names), source


def test_import_json_contract_and_report(imported: Imported) -> None:
    workspace, out = imported("timeslicing-mig")
    assert set(out) == {"ok", "environment", "files", "mapping", "unsupported", "adoption", "configs", "next",
                        "errors"}
    assert out["ok"] is True and out["environment"] == ENV and out["errors"] == []
    assert out["mapping"] == {"device-plugin.config=ts-4": ["ts-4"], "device-plugin.config=ts-2": ["ts-2"],
                              "mig.config=all-balanced": ["all-balanced"], "mig.config=all-1g.10gb": ["all-1g-10gb"]}
    assert sorted(out["files"]) == sorted([
        f"environments/{ENV}.yaml", f"Pulumi.{ENV}.yaml", f"imports/{ENV}-report.yaml", "profiles/all-1g-10gb.yaml",
        "profiles/all-balanced.yaml", "profiles/ts-2.yaml", "profiles/ts-4.yaml",
        # the adoption stage: limits measured on the cluster, for an environment guardrails.yaml does not name
        f"policies/guardrails.d/{ENV}.yaml", *(f"policies/waivers.d/{ENV}-adoption.yaml"
                                              for _ in out["adoption"]["waived"][:1]),
        # the device-plugin configs the nodes name today, kept under their names until the rollout relabels them
        f"imports/{ENV}-configs/ts-2.yaml", f"imports/{ENV}-configs/ts-4.yaml"])
    assert {(u["object"], u["field"]) for u in out["unsupported"]} == {
        ("Node/a100-02", "labels[nvidia.com/mig.config.state]"),
        ("Node/a100-02", "status.allocatable"),  # mid-change: it still allocates its old layout
        ("Node/a100-03", "labels[nvidia.com/mig.config.state]"),
        ("ConfigMap/time-slicing-config", "ts-8"),
        # What the first rollout changes in the operator: Ansible takes these over; a deprecated field goes.
        *(("ClusterPolicy/cluster-policy", f"spec.{f}") for f in (
            "driver.enabled", "toolkit.enabled", "migManager.enabled", "operator.defaultRuntime")),
        # toolkit 1.17.8 is below the CVE floor, which no waiver covers: imported as the floor (a remediation)
        ("ClusterPolicy/cluster-policy", "spec.toolkit.version"),
        *((f"Node/a100-0{i}", "nvswitch") for i in (1, 2, 3))}  # 8-GPU hosts: HGX or not, the cluster does not say
    text = (workspace / "environments" / f"{ENV}.yaml").read_text()
    assert "#   ConfigMap/time-slicing-config ts-8: config no node uses" in text  # in comments too
    env = yaml.safe_load(text)
    pools = {p["name"]: p for p in env["pools"]}
    assert [h["name"] for h in pools["l4-ts-4"]["hosts"]] == ["l4-01", "l4-02"]
    assert pools["l4-ts-4"]["taints"] == [{"key": "dedicated", "value": "notebooks", "effect": "NoSchedule"}]
    assert [h["name"] for h in pools["a100-sxm4-80gb-all-balanced"]["hosts"]] == ["a100-01", "a100-03"]
    profile = yaml.safe_load((workspace / "profiles" / "ts-4.yaml").read_text())
    assert profile["time_slicing"] == {"replicas": 4, "rename_by_default": True,
                                       "fail_requests_greater_than_one": True}
    # What `gpushare check` will still ask for, which the dumps cannot say (the limits come with the import now).
    assert len(out["next"]) == 1
    assert "kubeconfig_context on cluster 'brown'" in out["next"][0]
    assert env["defaults"]["toolkit_version"] == "1.18.2" and out["adoption"]["remediation"] == []


def test_import_tenants_from_quotas_and_kueue(imported: Imported) -> None:
    workspace, out = imported("quotas-kueue")
    env = yaml.safe_load((workspace / "environments" / f"{ENV}.yaml").read_text())
    tenants = {t["name"]: t for t in env["tenants"]}
    assert tenants["research"]["quota"] == {"nvidia.com/gpu": 8}  # Kueue's nominal quota, not the ResourceQuota's 12
    assert tenants["research"]["borrowing_limit"] == {"nvidia.com/gpu": 4}
    assert tenants["search"]["quota"] == {"nvidia.com/mig-1g.10gb": 8, "nvidia.com/mig-3g.40gb": 4}
    # As the cluster treats them today: every team trusted (untrusted is a later, reviewed step), each namespace's
    # enforced Pod Security level kept, and each namespace's own GPU quota taken over in place, never a second one.
    assert {t["trust"] for t in tenants.values()} == {"trusted"}
    assert {n: t.get("pod_security") for n, t in tenants.items()} == {"research": "baseline", "search": "restricted"}
    assert {t["quota_name"] for t in tenants.values()} == {"gpu-quota"}
    assert env["adoption"] == {"imported": env["adoption"]["imported"], "admission": "warn", "pod_security": "warn",
                               "shared_gpu_taint": False, "host_defaults": False,
                               # the site's gpu-online has gpushare's online value: kept, never a second class
                               "priority_classes": {"online": "gpu-online"}}
    stack = yaml.safe_load((workspace / f"Pulumi.{ENV}.yaml").read_text())["config"]
    assert stack["gpushare:kueue"] == {"mode": "existing"}  # the cluster runs Kueue: never a second one
    assert stack["gpushare:monitoring"]["mode"] == "install"  # nothing shows a Prometheus stack here
    reported = {(u["object"], u["field"]) for u in out["unsupported"]}
    assert ("ResourceQuota/search/gpu-quota", "spec.hard[requests.cpu]") in reported
    assert ("PriorityClass/gpu-online", "value") in reported  # said: kept in gpushare's online place
    assert ("ClusterQueue/research-cq", "spec.cohort") in reported
    assert not any(u["object"] == "PriorityClass/system-cluster-critical" for u in out["unsupported"])


def test_import_reuses_an_equal_workspace_profile(imported: Imported) -> None:
    workspace, out = imported("default-operator")
    assert "profiles/exclusive.yaml" not in out["files"]  # `gpushare init` ships an equal one
    env = yaml.safe_load((workspace / "environments" / f"{ENV}.yaml").read_text())
    assert [p["profile"] for p in env["pools"]] == ["exclusive"]


def test_import_overwrites_nothing(imported: Imported) -> None:
    workspace, _ = imported("timeslicing-mig")
    before = {p: p.read_bytes() for p in workspace.rglob("*") if p.is_file()}
    code, out = cli("import", "--from", str(CLUSTERS / "timeslicing-mig"), "--env", ENV, "--out", str(workspace))
    assert code == 2 and "would overwrite" in out["errors"][0]
    assert {p: p.read_bytes() for p in workspace.rglob("*") if p.is_file()} == before


def test_import_needs_a_workspace_and_one_source(tmp_path: Path) -> None:
    code, out = cli("import", "--from", str(CLUSTERS / "timeslicing-mig"), "--env", ENV, "--out", str(tmp_path))
    assert code == 2 and "not a gpushare workspace" in out["errors"][0]
    assert list(tmp_path.iterdir()) == []
    code, out = cli("import", "--env", ENV, "--out", str(tmp_path))
    assert code == 2 and "exactly one of --from and --kubeconfig" in out["errors"][0]
    workspace = tmp_path / "ws"
    write_workspace(workspace)
    code, out = cli("import", "--from", str(CLUSTERS), "--env", ENV, "--out", str(workspace))
    assert code == 2 and "holds no .yaml files" in out["errors"][0]
    code, out = cli("import", "--from", str(CLUSTERS / "timeslicing-mig"), "--env", "Prod!", "--out", str(workspace))
    assert code == 2 and "not a DNS label" in out["errors"][0]


def test_nodes_gpushare_cannot_express_are_reported_not_dropped(tmp_path: Path) -> None:
    from gpushare.ops.brownfield.cluster import read_dumps
    from gpushare.ops.brownfield.importer import import_cluster

    state = read_dumps(CLUSTERS / "not-taken-effect")
    nodes = {n["metadata"]["name"]: n for n in state.of("Node")}
    nodes["l4-11"]["spec"]["providerID"] = "gce://project/europe-west4-a/l4-11"
    nodes["l4-12"]["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-Quadro-Nonexistent-SHARED"
    result = import_cluster(state, ENV)
    reported = {(u.object, u.field) for u in result.unsupported}
    assert ("Node/l4-11", "spec.providerID") in reported
    assert ("Node/l4-12", "labels[nvidia.com/gpu.product]") in reported
    assert [n.name for n in result.nodes] == ["l4-11"]
    assert "Node/l4-12 labels[nvidia.com/gpu.product]" in result.files[f"environments/{ENV}.yaml"]

# ---------------------------------------------------------------- what the GPU Operator hands its operands


BOTH = CLUSTERS / "default-and-custom"  # NVIDIA's default mig-parted ConfigMap beside the custom one it names


def state_of(folder: Path = BOTH) -> ClusterState:
    state = read_dumps(folder)
    state.objects = copy.deepcopy(state.objects)
    return state


def policy(state: ClusterState) -> dict[str, Any]:
    return state.of("ClusterPolicy")[0]


def node(state: ClusterState, name: str) -> dict[str, Any]:
    return next(n for n in state.of("Node") if n["metadata"]["name"] == name)


def layout_of(result: ImportResult, host: str) -> str:
    profile = next(n.profile for n in result.nodes if n.name == host)
    data = yaml.safe_load(result.files[f"profiles/{profile}.yaml"])
    return str(data["mig"]["layouts"]["NVIDIA A100-SXM4-80GB"])


def reported(result: ImportResult) -> dict[tuple[str, str], str]:
    return {(u.object, u.field): u.reason for u in result.unsupported}


def test_the_layout_comes_from_the_configmap_mig_manager_reads() -> None:
    # Both ConfigMaps define all-balanced; NVIDIA's comes last in the dump, so merging them would take it.
    result = import_cluster(state_of(), ENV)
    assert layout_of(result, "a100-02") == "1g.10gb=3,2g.20gb=2"
    notes = reported(result)
    assert "no node reads these" in notes[("ConfigMap/default-mig-parted-config", "data")]
    assert ("Node/a100-02", "status.allocatable") not in notes


def test_without_a_configmap_name_mig_manager_reads_nvidias_default() -> None:
    state = state_of()
    del policy(state)["spec"]["migManager"]["config"]["name"]
    result = import_cluster(state, ENV)
    assert layout_of(result, "a100-02") == "1g.10gb=2,2g.20gb=1,3g.40gb=1"  # NVIDIA's all-balanced
    # ... which is not what the node allocates: said, naming the node and both counts.
    reason = reported(result)[("Node/a100-02", "status.allocatable")]
    assert "nvidia.com/mig-1g.10gb=12, nvidia.com/mig-2g.20gb=8" in reason
    assert "nvidia.com/mig-1g.10gb=8, nvidia.com/mig-2g.20gb=4, nvidia.com/mig-3g.40gb=4" in reason


def test_a_missing_mig_configmap_leaves_its_nodes_out_and_says_why() -> None:
    state = state_of()
    policy(state)["spec"]["migManager"]["config"]["name"] = "gone"
    result = import_cluster(state, ENV)
    assert {n.name for n in result.nodes} == {"a100-03", "l4-01"}  # all-disabled needs no config
    reason = reported(result)[("Node/a100-01", "labels[nvidia.com/mig.config]")]
    assert "ConfigMap 'gone' (spec.migManager.config.name) is not in the dump" in reason


def test_the_operators_namespace_decides_between_configmaps_of_one_name() -> None:
    state = state_of()
    nvidia = next(c for c in state.of("ConfigMap") if c["metadata"]["name"] == "default-mig-parted-config")
    stray = copy.deepcopy(nvidia)
    stray["metadata"] = {"name": "custom-mig-parted-config", "namespace": "kube-system"}
    state.objects["ConfigMap"].append(stray)
    assert layout_of(import_cluster(state, ENV), "a100-02") == "1g.10gb=3,2g.20gb=2"  # status.namespace: gpu-operator
    del policy(state)["status"]["namespace"]
    with pytest.raises(GpushareError) as err:
        import_cluster(state, ENV)
    problem = err.value.problems[0]
    assert "gpu-operator, kube-system" in problem.message and problem.path == "spec.migManager.config.name"


def test_time_slicing_nvidia_gpu_leaves_mig_devices_unshared_under_mixed() -> None:
    result = import_cluster(state_of(), ENV)
    profiles = {n.name: yaml.safe_load(result.files[f"profiles/{n.profile}.yaml"]) for n in result.nodes
                if f"profiles/{n.profile}.yaml" in result.files}
    assert profiles["a100-01"]["kind"] == "mig"  # allocates 56 whole MIG devices, not 224 replicas
    assert profiles["a100-03"]["kind"] == "time-slicing"  # MIG off: the same default config shares its GPUs
    assert profiles["a100-03"]["time_slicing"]["replicas"] == 4
    assert result.mapping["device-plugin.config=default"] == ["all-1g-10gb", "all-balanced", "default"]
    assert result.mapping["mig.config=all-disabled"] == ["default"]
    assert result.mapping["device-plugin.config=whole"] == ["exclusive"]


def test_under_the_single_strategy_the_same_config_time_slices_mig_devices() -> None:
    state = state_of()
    policy(state)["spec"]["mig"]["strategy"] = "single"
    state.objects["Node"] = [node(state, "a100-01")]
    for where in ("capacity", "allocatable"):
        node(state, "a100-01")["status"][where] = {"nvidia.com/gpu": "224"}
    result = import_cluster(state, ENV)
    profile = yaml.safe_load(result.files[f"profiles/{result.nodes[0].profile}.yaml"])
    assert profile["kind"] == "mig-time-slicing" and profile["time_slicing"]["replicas"] == 4
    assert ("Node/a100-01", "status.allocatable") not in reported(result)


def test_a_config_sharing_only_some_of_a_nodes_resources_is_refused_for_that_node() -> None:
    state = state_of()
    configs = next(c for c in state.of("ConfigMap") if c["metadata"]["name"] == "device-plugin-configs")
    configs["data"]["default"] = ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                  "      - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n")
    result = import_cluster(state, ENV)
    names = {n.name for n in result.nodes}
    assert "a100-01" in names  # all its devices are 1g.10gb: mig-time-slicing x2
    assert "a100-02" not in names  # 1g.10gb shared, 2g.20gb not: one count per node cannot say it
    assert "shares nvidia.com/mig-1g.10gb x2 of the node's" in reported(result)[
        ("Node/a100-02", "labels[nvidia.com/device-plugin.config]")]


def test_without_a_device_plugin_configmap_the_label_does_nothing() -> None:
    state = state_of()
    del policy(state)["spec"]["devicePlugin"]["config"]
    result = import_cluster(state, ENV)
    reason = reported(result)[("Node/l4-01", "labels[nvidia.com/device-plugin.config]")]
    assert "spec.devicePlugin.config.name is unset" in reason and "ignores the label" in reason
    assert not any(k.startswith("device-plugin.config=") for k in result.mapping)


def test_the_report_lists_every_operator_setting_the_rollout_changes() -> None:
    notes = {f: r for (o, f), r in reported(import_cluster(state_of(), ENV)).items()
             if o == "ClusterPolicy/cluster-policy"}
    assert set(notes) == {f"spec.{p}" for p in (
        "driver.enabled", "toolkit.enabled", "migManager.enabled", "dcgm.enabled", "operator.use_ocp_driver_toolkit",
        "operator.defaultRuntime", "validator.plugin.env")}
    assert notes["spec.driver.enabled"].startswith("true -> false") and "installs none" in notes["spec.driver.enabled"]
    assert "WITH_WORKLOAD" in notes["spec.validator.plugin.env"]
    assert "gpushare:operatorValues" in notes["spec.operator.use_ocp_driver_toolkit"]
    # An operand already off stays off: nothing to report; one gpushare needs is turned on, and said.
    state = state_of()
    spec = policy(state)["spec"]
    spec["driver"] = {"enabled": False, "version": "570.1"}
    spec["dcgmExporter"] = {"enabled": False}
    notes = {f: r for (o, f), r in reported(import_cluster(state, ENV)).items() if o == "ClusterPolicy/cluster-policy"}
    assert not any(f.startswith("spec.driver.") for f in notes)
    assert notes["spec.dcgmExporter.enabled"].startswith("false -> true")


def test_the_reported_operator_settings_are_what_the_program_sets(imported: Any) -> None:
    """The report's account of the rollout's operator values must be the Pulumi program's, not a model of it."""
    from gpushare.core.resolve import resolve_env
    from gpushare.ops.brownfield import operator
    from gpushare.program.components.operator_values import ClusterGpus, operator_values

    imported("default-and-custom")
    fleet = resolve_env(ENV)
    values = operator_values(fleet, ClusterGpus.of(fleet, fleet.clusters[ENV]), device_plugin_hash="0",
                             mig_parted_hash=None, dcgm_counters_hash="0", monitoring_release="kube-prometheus-stack")
    for component in operator.TURNED_OFF:
        assert values.get(component, {}).get("enabled") is False, component
    for component in operator.TURNED_ON:
        assert values[component]["enabled"] is True, component
    covered = (*operator.CONVERTED, *operator.REPLACED, *((c, "enabled") for c in (*operator.TURNED_OFF,
                                                                                    *operator.TURNED_ON)))
    for path in _leaf_paths(values):
        if path[0] == "node-feature-discovery":
            continue  # a subchart's values: no ClusterPolicy field
        assert any(path[:len(c)] == c for c in covered), path


def _leaf_paths(node: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(node, dict) and node:
        return [p for k, v in node.items() for p in _leaf_paths(v, (*path, str(k)))]
    return [path]


def test_a_dump_file_may_hold_several_documents(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    nodes = yaml.safe_load((CLUSTERS / "timeslicing-mig" / "nodes.yaml").read_text())
    first, rest = nodes["items"][0], nodes["items"][1:]
    text = "---\n".join([yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": rest}), "",
                         yaml.safe_dump(first)])  # a List, an empty document, one object
    (dumps / "all.yaml").write_text(text + "---\n" + (CLUSTERS / "timeslicing-mig" / "clusterpolicies.yaml")
                                    .read_text() + "---\n" + (CLUSTERS / "timeslicing-mig" / "configmaps.yaml")
                                    .read_text())
    state = read_dumps(dumps)
    assert sorted(n["metadata"]["name"] for n in state.of("Node")) == sorted(n["metadata"]["name"]
                                                                            for n in nodes["items"])
    assert len(state.of("ClusterPolicy")) == 1 and len(state.of("ConfigMap")) == 2
    # A broken later document is refused with its file and line, like any YAML file.
    (dumps / "all.yaml").write_text(text + "---\nkind: Node\nkind: Node\n")
    with pytest.raises(GpushareError) as err:
        read_dumps(dumps)
    problem = err.value.problems[0]
    assert "appears twice" in problem.message and problem.file == str(dumps / "all.yaml")
    assert problem.line == text.count("\n") + 3


def test_a_live_context_is_written_and_not_asked_for_again(tmp_path: Path) -> None:
    from gpushare.cli.init import write_workspace

    workspace = tmp_path / "ws"
    write_workspace(workspace)
    result = import_cluster(state_of(), ENV, context="prod-admin")
    env = yaml.safe_load(result.files[f"environments/{ENV}.yaml"])
    assert env["clusters"][0]["kubeconfig_context"] == "prod-admin"


@pytest.mark.slow  # runs `gpushare check` with its offline Pulumi plan
def test_doing_what_next_says_leaves_check_nothing_to_ask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpushare.cli.init import write_workspace

    workspace = tmp_path / "ws"
    write_workspace(workspace)
    monkeypatch.setenv("GPUSHARE_ROOT", str(workspace))
    code, out = cli("import", "--from", str(BOTH), "--env", ENV, "--out", str(workspace))
    assert code == 0 and len(out["next"]) == 1  # the guardrail limits come with the import (guardrails.d)
    code, checked = cli("check", "--env", ENV)
    assert code != 0 and "kubeconfig context" in checked["errors"][0]
    # The one step `next` names, which a dump cannot say: a context on the cluster.
    env_file = workspace / "environments" / f"{ENV}.yaml"
    env = yaml.safe_load(env_file.read_text())
    env["clusters"][0]["kubeconfig_context"] = ENV
    env_file.write_text(yaml.safe_dump(env, sort_keys=False))
    code, checked = cli("check", "--env", ENV)
    assert "errors" not in checked, checked  # the rules ran, on the cluster as it runs: nothing mandatory fails
    assert code == 0, checked["violations"]
