"""`gpushare import`: every fixture cluster imports to a workspace that validates and round-trips through
`render` (same MIG layout and same advertised resources per node as the source), with nothing dropped silently."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.cli.init import write_workspace
from gpushare.core.resolve import resolve_env
from gpushare.render.fleet import parse_device_plugin, parse_mig_parted, render_fleet
from tests.brownfield.conftest import CLUSTERS, ENV, FIXTURES, cli

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
