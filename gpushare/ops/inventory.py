"""The resolved fleet as an Ansible inventory: groups per environment, cluster and pool, and per host the facts
the roles read (GPU model, driver branch, MIG config name and rendered content, device-plugin config, labels).

Only bare-metal (Ansible-managed) hosts are listed; cloud node pools belong to Pulumi. The inventory plugin
gpushare.fleet.gpushare_fleet is a thin adapter over `build_inventory`, so tests read the same data without Ansible.

Every string here comes from a validated environment file (spec.py's patterns), the catalog, policies/ or gpushare's
own renderers, and Ansible receives all of it as untrusted data that it never templates (ansible-core 2.19).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.core.guardrails import load_guardrails
from gpushare.core.paths import lexical_workspace
from gpushare.core.resolve import ResolvedFleet, ResolvedNode, resolve
from gpushare.render.fleet import containerd_runtime, mig_parted_configs, render_fleet
from gpushare.render.templating import environment

# Labels that other tools may put on a node gpushare's Ansible manages; verification never reads them
# (the GPU Operator labels opted-out hosts nvidia.com/mig.config=all-disabled).
IGNORED_NODE_LABELS = ("nvidia.com/mig.config",)


def group_name(kind: str, name: str) -> str:
    """Ansible group names allow letters, digits and underscores only."""
    return f"{kind}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}"


@dataclass
class Group:
    name: str
    children: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)


@dataclass
class Inventory:
    groups: dict[str, Group] = field(default_factory=dict)
    hostvars: dict[str, dict[str, Any]] = field(default_factory=dict)

    def group(self, name: str) -> Group:
        return self.groups.setdefault(name, Group(name))


def _layout_text(layout: dict[str, int] | None) -> str:
    return ",".join(f"{name}={count}" for name, count in layout.items()) if layout else ""


def host_mig_parted_config(node: ResolvedNode, fleet: ResolvedFleet, configs: dict[str, Any]) -> str | None:
    """The rendered mig-parted config reduced to what this host selects (and all-disabled), from the same template
    `gpushare render` uses: a change to another pool's layout then leaves this host's file as it is."""
    if node.mig_config is None:
        return None
    names = ["all-disabled", node.mig_config] if node.mig_config != "all-disabled" else ["all-disabled"]
    return environment().get_template("mig-parted-config.yaml.j2").render(
        environment=fleet.environment, configs={name: configs[name] for name in names})


def host_vars(node: ResolvedNode, fleet: ResolvedFleet, files: dict[str, str],
              mig_configs: dict[str, Any]) -> dict[str, Any]:
    cluster = fleet.clusters[node.cluster]
    runtime = containerd_runtime(node.containerd_version)
    dp = node.device_plugin_config
    return {
        "ansible_host": node.address,
        "gpushare_pool": node.pool,
        "gpushare_cluster": node.cluster,
        "gpushare_kubeconfig_context": cluster.kubeconfig_context or "",
        "gpushare_cdi": cluster.cdi,
        "gpushare_profile": node.profile,
        "gpushare_sharing": node.sharing,
        "gpushare_gpu_model": node.gpu_model.name,
        "gpushare_gpu_pci_device_ids": list(node.gpu_model.pci_device_ids),
        "gpushare_gpu_mig_capable": node.gpu_model.mig_capable,
        "gpushare_gpu_count": node.gpus_per_node,
        "gpushare_driver_branch": node.driver_branch,
        "gpushare_nvswitch": node.nvswitch,
        "gpushare_toolkit_version": node.toolkit_version,
        "gpushare_containerd_version": node.containerd_version,
        "gpushare_containerd_dropin": files[f"containerd/{runtime.filename}"],
        "gpushare_containerd_default_runtime": runtime.default_runtime,
        "gpushare_containerd_cri_plugin": runtime.cri_plugin,
        "gpushare_mig_config": node.mig_config,
        "gpushare_mig_parted_config": host_mig_parted_config(node, fleet, mig_configs),
        "gpushare_mig_layout": node.mig_layout,
        "gpushare_mig_layout_text": _layout_text(node.mig_layout),
        "gpushare_device_plugin_config": dp,
        "gpushare_device_plugin_config_content": files[f"device-plugin/{dp}.yaml"] if dp else None,
        "gpushare_node_labels": node.labels_owned_by("ansible"),
    }


def build_inventory(fleet: ResolvedFleet) -> Inventory:
    files = render_fleet(fleet).files
    mig_configs = mig_parted_configs(fleet)
    toolkit = load_guardrails().toolkit
    inv = Inventory()
    env_group = inv.group(group_name("env", fleet.environment))
    env_group.vars = {
        "gpushare_environment": fleet.environment,
        "gpushare_environment_file": str(Path(fleet.source).resolve()),
        "gpushare_toolkit_config": files["nvidia-container-toolkit/config.toml"],
        "gpushare_toolkit_min_version": toolkit.min_version,
        "gpushare_toolkit_fixes": [{"cve": f.cve, "fixed_in": f.fixed_in} for f in toolkit.fixes],
        "gpushare_ignored_node_labels": list(IGNORED_NODE_LABELS),
    }
    for pool in fleet.pools:
        nodes = [n for n in pool.nodes if n.managed_by == "ansible"]
        if not nodes:
            continue
        cluster_name = group_name("cluster", pool.cluster)
        if cluster_name not in env_group.children:
            env_group.children.append(cluster_name)
        pool_group = inv.group(group_name("pool", pool.name))
        inv.group(cluster_name).children.append(pool_group.name)
        for node in nodes:
            pool_group.hosts.append(node.name)
            inv.hostvars[node.name] = host_vars(node, fleet, files, mig_configs)
    return inv


def inventory_from_file(path: Path) -> Inventory:
    """The inventory of an environment file, read with the profiles and guardrails of the workspace the file lies in
    (found from its path as written, links not followed): `ansible-inventory -i /srv/fleet/environments/dev.yaml`
    works from any directory, as Ansible runs it (AWX, cron, another checkout). GPUSHARE_ROOT still names the
    workspace where set; a file in no workspace falls back to the working directory's."""
    root = None if os.environ.get("GPUSHARE_ROOT") else lexical_workspace(path)
    if root is None:
        return build_inventory(resolve(path))
    with _workspace_root(root):
        return build_inventory(resolve(path))


@contextmanager
def _workspace_root(root: Path) -> Iterator[None]:
    os.environ["GPUSHARE_ROOT"] = str(root)
    try:
        yield
    finally:
        del os.environ["GPUSHARE_ROOT"]


def is_environment_file(path: Path) -> bool:
    """Environment files are recognised by where they live: directly in a directory named `environments`."""
    return path.suffix in (".yaml", ".yml") and path.parent.name == "environments"
