"""`gpushare import`: a cluster's GPU sharing turned into an environment file and sharing profiles that reproduce
it. Pools group nodes with the same GPU model, configs, taints and driver; profiles are named after the configs
they came from; tenants come from quotas and Kueue queues. What gpushare cannot express is never dropped in
silence: it goes to `unsupported` (the report, and comments at the top of the environment file)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpushare.core.catalog import GpuModel
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.spec import is_system_namespace
from gpushare.ops.brownfield.cluster import (
    COUNT_LABEL,
    DEVICE_PLUGIN_LABEL,
    DRIVER_LABEL,
    MIG_DISABLED,
    OPERATOR_MIG_LABEL,
    OPERATOR_STATE_LABEL,
    PRODUCT_LABEL,
    ClusterState,
    SharingConfig,
    Unsupported,
    gpu_resources,
    internal_ip,
    is_dns_label,
    kubernetes_minor,
    labels_of,
    mig_entries_partial,
    mig_layout,
    name_of,
    product_model,
    sharing_config,
    tenant_namespaces,
    valid_name,
)

# Used only where the ClusterPolicy names no toolkit version; reported, and `gpushare check` judges it.
FALLBACK_TOOLKIT = "1.18.2"
FALLBACK_DRIVER = 570
# Taints Kubernetes itself sets: never a pool's.
SYSTEM_TAINT_PREFIXES = ("node.kubernetes.io/", "node-role.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
PURPOSE = {"exclusive": "training", "mig": "inference", "mig-time-slicing": "inference", "time-slicing": "development",
           "mps": "development"}


@dataclass
class ImportedNode:
    name: str
    address: str
    model: GpuModel
    gpu_count: int
    driver: int
    profile: str
    taints: tuple[tuple[str, str, str], ...]
    mig_config: str | None  # the source config names, for the mapping
    device_plugin_config: str | None


@dataclass
class ImportResult:
    environment: str
    files: dict[str, str]  # path relative to the workspace -> text
    mapping: dict[str, str]  # source config -> profile
    unsupported: list[Unsupported]
    nodes: list[ImportedNode] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"environment": self.environment, "files": sorted(self.files), "mapping": self.mapping,
                "unsupported": [u.as_dict() for u in self.unsupported]}


class _Importer:
    def __init__(self, state: ClusterState, env: str) -> None:
        self.state = state
        self.env = env
        self.unsupported: list[Unsupported] = []
        self.profiles: dict[str, dict[str, Any]] = {}
        self.profile_keys: dict[tuple[str | None, str | None], str] = {}
        self.mapping: dict[str, str] = {}
        self.spec = self.state.cluster_policy.get("spec") or {}
        self.cp_name = f"ClusterPolicy/{name_of(self.state.cluster_policy)}"
        self.sharing: dict[str, SharingConfig] = {
            name: sharing_config(name, data, self.unsupported, "device-plugin ConfigMap")
            for name, data in self.state.device_plugin_configs().items()}
        self.mig: dict[str, list[dict[str, Any]]] = self.state.mig_configs()

    def note(self, obj: str, where: str, reason: str) -> None:
        self.unsupported.append(Unsupported(obj, where, reason))

    # -- nodes

    def node(self, node: dict[str, Any]) -> ImportedNode | None:
        name, labels = name_of(node), labels_of(node)
        obj = f"Node/{name}"
        if not is_dns_label(name):
            self.note(obj, "metadata.name", "not a DNS label, which gpushare host names must be; add the host by hand")
            return None
        model = product_model(labels.get(PRODUCT_LABEL, ""))
        if model is None:
            self.note(obj, f"labels[{PRODUCT_LABEL}]", f"GPU {labels.get(PRODUCT_LABEL)!r} is not in gpushare's "
                      "catalog; the node is left out")
            return None
        address = internal_ip(node)
        count = labels.get(COUNT_LABEL, "")
        if address is None or not count.isdigit() or not 1 <= int(count) <= 16:
            self.note(obj, "status.addresses" if address is None else f"labels[{COUNT_LABEL}]",
                      "no InternalIP or no GPU count between 1 and 16; the node is left out")
            return None
        usable, layout, mig_name = self.node_layout(obj, labels, model)
        if not usable:
            return None
        sharing, dp_name = self.node_sharing(obj, labels)
        if sharing is None:
            return None
        profile = self.profile_for(obj, model, layout, mig_name, sharing, dp_name)
        if profile is None:
            return None
        self.host_notes(obj, node, int(count))
        driver = self.driver(labels)
        return ImportedNode(name=name, address=address, model=model, gpu_count=int(count), driver=driver,
                            profile=profile, taints=self.taints(node), mig_config=mig_name,
                            device_plugin_config=dp_name)

    def host_notes(self, obj: str, node: dict[str, Any], count: int) -> None:
        provider = str((node.get("spec") or {}).get("providerID", ""))
        if provider.startswith(("gce://", "aws://")):
            self.note(obj, "spec.providerID", f"a cloud node ({provider.split(':')[0]}): imported as a bare-metal "
                      "host; gpushare makes cloud node pools through Pulumi, so move it to a cloud pool by hand")
        if count == 8:
            self.note(obj, "nvswitch", "the cluster does not show whether an 8-GPU host is an HGX system with "
                      "NVSwitch; set nvswitch: true on the host if it is (it then needs nvidia-fabricmanager)")

    def node_layout(self, obj: str, labels: dict[str, str], model: GpuModel
                    ) -> tuple[bool, dict[str, int] | None, str | None]:
        """(importable, layout, config name)."""
        name = labels.get(OPERATOR_MIG_LABEL)
        if name is None or not model.mig_capable or name == MIG_DISABLED:
            return True, None, None
        state = labels.get(OPERATOR_STATE_LABEL, "unknown")
        if state != "success":
            self.note(obj, f"labels[{OPERATOR_STATE_LABEL}]", f"MIG config {name!r} is {state} on this node: the "
                      "import takes the layout the label asks for, which the node does not run yet")
        entries = self.mig.get(name)
        if entries is None:
            self.note(obj, f"labels[{OPERATOR_MIG_LABEL}]", f"MIG config {name!r} is in no mig-parted ConfigMap of the "
                      "dump; the node is left out")
            return False, None, name
        if mig_entries_partial(entries):
            self.note(obj, f"labels[{OPERATOR_MIG_LABEL}]", f"MIG config {name!r} gives some GPUs another layout "
                      "(devices: [...]); gpushare gives every GPU of a node one layout; the node is left out")
            return False, None, name
        return True, mig_layout(entries, model) or None, name

    def node_sharing(self, obj: str, labels: dict[str, str]) -> tuple[SharingConfig | None, str | None]:
        default = ((self.spec.get("devicePlugin") or {}).get("config") or {}).get("default") or None
        name = labels.get(DEVICE_PLUGIN_LABEL) or default
        if name is None:
            return SharingConfig(name="", kind="exclusive"), None
        found = self.sharing.get(name)
        if found is None:
            self.note(obj, f"labels[{DEVICE_PLUGIN_LABEL}]", f"device-plugin config {name!r} is in no ConfigMap of "
                      "the dump; the node is left out")
        return found, name

    def driver(self, labels: dict[str, str]) -> int:
        text = labels.get(DRIVER_LABEL) or str((self.spec.get("driver") or {}).get("version", "")).split(".")[0]
        return int(text) if text.isdigit() and 450 <= int(text) <= 999 else FALLBACK_DRIVER

    def taints(self, node: dict[str, Any]) -> tuple[tuple[str, str, str], ...]:
        found = []
        for taint in (node.get("spec") or {}).get("taints") or []:
            key = str(taint.get("key", ""))
            if not key.startswith(SYSTEM_TAINT_PREFIXES):
                found.append((key, str(taint.get("value", "") or ""), str(taint.get("effect", "NoSchedule"))))
        return tuple(sorted(found))

    # -- profiles

    def profile_for(self, obj: str, model: GpuModel, layout: dict[str, int] | None, mig_name: str | None,
                    sharing: SharingConfig, dp_name: str | None) -> str | None:
        kind = sharing.kind
        if sharing.kind != "exclusive" and sharing.replicas < 2:
            self.note(obj, f"labels[{DEVICE_PLUGIN_LABEL}]", f"config {dp_name!r} shares with 1 replica, which is "
                      "exclusive use; imported as exclusive")
            kind = "exclusive"
        if layout is not None:
            if kind == "mps":
                self.note(obj, f"labels[{DEVICE_PLUGIN_LABEL}]", "MPS on MIG devices is not supported by the device "
                          "plugin; the node is left out")
                return None
            kind = "mig-time-slicing" if kind == "time-slicing" else "mig"
        key = (mig_name if layout is not None else None, dp_name if kind not in ("exclusive", "mig") else None)
        name = self.profile_keys.get(key) or self.new_profile(key, kind, sharing)
        profile = self.profiles[name]
        if layout is not None:
            text = ",".join(f"{p}={n}" for p, n in sorted(layout.items()))
            profile["mig"]["layouts"][model.name] = text
        for source in key:
            if source:
                self.mapping[source] = name
        return name

    def new_profile(self, key: tuple[str | None, str | None], kind: str, sharing: SharingConfig) -> str:
        base = valid_name("-".join(p for p in key if p) or "exclusive", 30)
        name, n = base, 2
        while name in self.profiles:
            name, n = f"{base[:27]}-{n}", n + 1
        sources = " and ".join(f"{what} {p!r}" for what, p in zip(("mig-parted config", "device-plugin config"), key,
                                                                  strict=True) if p)
        profile: dict[str, Any] = {"name": name, "kind": kind,
                                   "description": f"Imported from {sources or 'whole GPUs (no sharing config)'}."}
        if kind in ("mig", "mig-time-slicing"):
            profile["mig"] = {"layouts": {}}
        if kind in ("time-slicing", "mig-time-slicing"):
            profile["time_slicing"] = {"replicas": sharing.replicas, "rename_by_default": sharing.rename_by_default,
                                       "fail_requests_greater_than_one": sharing.fail_requests_greater_than_one}
        if kind == "mps":
            profile["mps"] = {"replicas": sharing.replicas, "rename_by_default": sharing.rename_by_default}
        self.profiles[name] = profile
        self.profile_keys[key] = name
        return name

    # -- the cluster, tenants and what is left over

    def cluster(self, nodes: list[dict[str, Any]]) -> dict[str, Any]:
        strategy = (self.spec.get("mig") or {}).get("strategy", "single")
        cdi = (self.spec.get("cdi") or {}).get("enabled", True)
        if strategy not in ("single", "mixed"):
            self.note(self.cp_name, "spec.mig.strategy", f"{strategy!r} is not single or mixed; imported as mixed")
            strategy = "mixed"
        return {"name": self.env, "kind": "bare-metal", "kubernetes_version": kubernetes_minor(nodes),
                "mig_strategy": strategy, "cdi": bool(cdi)}

    def toolkit_version(self) -> str:
        text = str((self.spec.get("toolkit") or {}).get("version", ""))
        found = re.match(r"v?(\d+\.\d+\.\d+)", text)
        if found is None:
            self.note(self.cp_name, "spec.toolkit.version", f"no toolkit version; imported as {FALLBACK_TOOLKIT} "
                      "(`gpushare check` judges it against the CVE floor)")
            return FALLBACK_TOOLKIT
        return found.group(1)

    def tenants(self, advertised: set[str]) -> list[dict[str, Any]]:
        out = []
        for namespace in tenant_namespaces(self.state):
            quota, borrowing = self.namespace_quota(namespace)
            for resource in sorted(set(quota) - advertised):
                self.note(f"Namespace/{namespace}", f"quota[{resource}]", "no imported pool advertises it; left out")
                quota.pop(resource)
                borrowing.pop(resource, None)
            if not is_dns_label(namespace) or not quota:
                self.note(f"Namespace/{namespace}", "metadata.name", "no GPU quota on an imported resource, or not a "
                          "DNS label: no tenant made")
                continue
            self.note(f"Namespace/{namespace}", "trust", "the cluster does not say whether this team is trusted; "
                      "imported as untrusted (the safe default): set trust: trusted where it is")
            tenant: dict[str, Any] = {"name": namespace, "namespace": namespace, "trust": "untrusted",
                                      "priority": "batch", "quota": quota}
            if borrowing:
                tenant["borrowing_limit"] = borrowing
            out.append(tenant)
        return out

    def namespace_quota(self, namespace: str) -> tuple[dict[str, int], dict[str, int]]:
        """Kueue's nominal quota and borrowing limit where a LocalQueue serves the namespace, else the
        ResourceQuota's GPU limits."""
        queues = [q for q in self.state.of("LocalQueue") if (q.get("metadata") or {}).get("namespace") == namespace]
        for q in self.state.of("ResourceQuota"):
            if (q.get("metadata") or {}).get("namespace") != namespace:
                continue
            hard = (q.get("spec") or {}).get("hard") or {}
            for key in sorted(k for k in hard if not k.removeprefix("requests.").startswith("nvidia.com/")):
                self.note(f"ResourceQuota/{namespace}/{name_of(q)}", f"spec.hard[{key}]", "not a GPU resource; "
                          "gpushare manages GPU quotas only, so keep this quota outside gpushare")
        if queues:
            return self.queue_quota(namespace, queues)
        quota: dict[str, int] = {}
        for q in self.state.of("ResourceQuota"):
            if (q.get("metadata") or {}).get("namespace") == namespace:
                quota.update(gpu_resources((q.get("spec") or {}).get("hard") or {}))
        return quota, {}

    def queue_quota(self, namespace: str, queues: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, int]]:
        quota: Counter[str] = Counter()
        borrowing: Counter[str] = Counter()
        wanted = {str((q.get("spec") or {}).get("clusterQueue")) for q in queues}
        for cq in self.state.of("ClusterQueue"):
            if name_of(cq) not in wanted:
                continue
            spec = cq.get("spec") or {}
            cohort = spec.get("cohortName") or spec.get("cohort")
            if cohort:
                self.note(f"ClusterQueue/{name_of(cq)}", "spec.cohort", f"cohort {cohort!r}: gpushare puts every "
                          "tenant of a cluster in one cohort of its own naming")
            for group in spec.get("resourceGroups") or []:
                for flavor in group.get("flavors") or []:
                    for res in flavor.get("resources") or []:
                        rname = str(res.get("name"))
                        if rname.startswith("nvidia.com/"):
                            quota[rname] += int(res.get("nominalQuota", 0))
                            borrowing[rname] += int(res.get("borrowingLimit", 0) or 0)
        return dict(quota), {k: v for k, v in borrowing.items() if v}

    def leftovers(self, used_sharing: set[str], used_mig: set[str]) -> None:
        for name in sorted(set(self.sharing) - used_sharing):
            self.note("device-plugin ConfigMap", name, "config no node uses; not imported")
        for name in sorted(set(self.mig) - used_mig - {MIG_DISABLED}):
            self.note("mig-parted ConfigMap", name, "config no node uses; not imported")
        for key in sorted(set(self.spec) - CLUSTER_POLICY_KEYS):
            self.note(self.cp_name, f"spec.{key}", "operator setting gpushare does not render; carry it into "
                      "the operator values by hand if you need it")
        for obj in self.state.of("NVIDIADriver"):
            self.note(f"NVIDIADriver/{name_of(obj)}", "spec", "per-pool driver objects: gpushare pins one driver "
                      "branch per environment or host (driver_branch)")
        for obj in self.state.of("PriorityClass"):
            if not name_of(obj).startswith("system-"):
                self.note(f"PriorityClass/{name_of(obj)}", "value", "gpushare has two priorities, online and batch; "
                          "map tenants to them by hand")
        for what, where in self.state.unknown:
            self.note(what, where, "object kind the import does not read")
        for ns in {str((o.get("metadata") or {}).get("namespace", "")) for o in self.state.of("ResourceQuota")}:
            if ns and is_system_namespace(ns):
                self.note(f"Namespace/{ns}", "ResourceQuota", "a system namespace is never a tenant")


CLUSTER_POLICY_KEYS = {"mig", "cdi", "devicePlugin", "migManager", "toolkit", "driver", "operator", "dcgmExporter",
                       "gfd", "dcgm", "nodeStatusExporter", "validator", "daemonsets"}


def import_cluster(state: ClusterState, env: str, existing: dict[str, Any] | None = None) -> ImportResult:
    """The workspace files (environment, profiles, Pulumi stack) that reproduce the cluster. `existing`: the
    workspace's profiles by name; an imported profile equal to one of them is reused, never overwritten."""
    imp = _Importer(state, env)
    gpu_nodes = state.gpu_nodes()
    nodes = [n for n in (imp.node(node) for node in gpu_nodes) if n is not None]
    if not nodes:
        raise GpushareError(Problem(
            f"no GPU node to import in {state.source}: an environment needs at least one pool",
            file=str(state.source), fix="dump the cluster's nodes too (`kubectl get nodes -o yaml "
            "--show-managed-fields > DIR/nodes.yaml`, see docs/adoption.md), or point at the right cluster"),
            exit_code=2)
    reused = _settle_names(imp, nodes, existing or {})
    imp.leftovers({n.device_plugin_config for n in nodes if n.device_plugin_config},
                  {n.mig_config for n in nodes if n.mig_config})
    driver = Counter(n.driver for n in nodes).most_common(1)[0][0] if nodes else FALLBACK_DRIVER
    pools = _pools(nodes, imp.profiles, env, driver)
    advertised = _advertised_resources(nodes, imp)
    environment: dict[str, Any] = {
        "apiVersion": "gpushare.io/v1", "kind": "Environment", "name": env,
        "description": f"Imported from a running cluster ({state.source}); review before the first rollout.",
        "defaults": {"driver_branch": driver, "toolkit_version": imp.toolkit_version()},
        "clusters": [imp.cluster(gpu_nodes)], "pools": pools, "tenants": imp.tenants(advertised)}
    files = {f"environments/{env}.yaml": _environment_text(environment, imp.unsupported, state.source),
             f"Pulumi.{env}.yaml": _stack_text(env)}
    for name, profile in sorted(imp.profiles.items()):
        if name in reused:
            continue
        files[f"profiles/{name}.yaml"] = _dump({"apiVersion": "gpushare.io/v1", **profile})
    files[f"imports/{env}-report.yaml"] = _dump({"environment": env, "source": state.source,
                                                 "mapping": imp.mapping,
                                                 "unsupported": [u.as_dict() for u in imp.unsupported]})
    return ImportResult(env, files, imp.mapping, imp.unsupported, nodes)


def _settle_names(imp: _Importer, nodes: list[ImportedNode], existing: dict[str, Any]) -> set[str]:
    """Rename imported profiles whose name the workspace already uses for something else; the names of those
    equal to a workspace profile (all but the description), which are reused."""
    from gpushare.core.spec import PROFILE_ADAPTER

    renames: dict[str, str] = {}
    reused: set[str] = set()
    for name in sorted(imp.profiles):
        if name not in existing:
            continue
        mine = PROFILE_ADAPTER.validate_python(imp.profiles[name]).model_copy(update={"description": ""})
        if mine == existing[name].model_copy(update={"description": ""}):
            reused.add(name)
            continue
        n = 2
        while f"{name[:27]}-{n}" in existing or f"{name[:27]}-{n}" in imp.profiles:
            n += 1
        renames[name] = f"{name[:27]}-{n}"
    for old, new in renames.items():
        imp.profiles[new] = {**imp.profiles.pop(old), "name": new}
    for node in nodes:
        node.profile = renames.get(node.profile, node.profile)
    imp.mapping = {k: renames.get(v, v) for k, v in imp.mapping.items()}
    return reused


def _pools(nodes: list[ImportedNode], profiles: dict[str, dict[str, Any]], env: str, driver: int
           ) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[ImportedNode]] = {}
    for n in nodes:
        groups.setdefault((n.model.name, n.profile, n.taints), []).append(n)
    pools: list[dict[str, Any]] = []
    names: set[str] = set()
    for (model, profile, taints), members in groups.items():
        base = valid_name(f"{members[0].model.slug}-{profile}")
        name, i = base, 2
        while name in names:
            name, i = f"{base[:60]}-{i}", i + 1
        names.add(name)
        hosts = []
        for n in members:
            host: dict[str, Any] = {"name": n.name, "address": n.address, "gpu_count": n.gpu_count}
            if n.driver != driver:
                host["driver_branch"] = n.driver
            hosts.append(host)
        pool: dict[str, Any] = {"name": name, "cluster": env, "purpose": PURPOSE[profiles[profile]["kind"]],
                                "gpu_model": model, "profile": profile}
        if taints:
            pool["taints"] = [{"key": k, "value": v, "effect": e} for k, v, e in taints]
        pool["hosts"] = hosts
        pools.append(pool)
    return pools


def _advertised_resources(nodes: list[ImportedNode], imp: _Importer) -> set[str]:
    """Resource names the imported pools advertise, as the resolver will name them (for tenant quotas)."""
    from gpushare.core import spec
    from gpushare.core.resolve import advertised_per_gpu

    cluster = spec.Cluster.model_validate(imp.cluster([]) | {"kubernetes_version": "1.31"})
    out: set[str] = set()
    for n in nodes:
        profile = spec.PROFILE_ADAPTER.validate_python(imp.profiles[n.profile])
        layout = None
        if getattr(profile, "mig", None) is not None:
            text = imp.profiles[n.profile]["mig"]["layouts"][n.model.name]
            layout = {p: int(c) for p, c in (item.split("=") for item in text.split(","))}
        out.update(advertised_per_gpu(profile, layout, cluster, False)[0])
    return out


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=110)


def _environment_text(environment: dict[str, Any], unsupported: list[Unsupported], source: str) -> str:
    lines = [f"# Written by `gpushare import` from {source}: the cluster's GPU sharing as gpushare expresses it.",
             "# Review trust, priority and purpose (the cluster does not say them) before the first rollout."]
    if unsupported:
        lines.append("# Not expressed here (also in imports/ and in `gpushare import --json`):")
        lines += [f"#   {u.object} {u.field}: {u.reason}" for u in unsupported]
    return "\n".join(lines) + "\n" + _dump(environment)


def _stack_text(env: str) -> str:
    return ("config:\n  # The fleet this stack makes true (written by `gpushare import`).\n"
            f"  gpushare:environment: environments/{env}.yaml\n  gpushare:monitoring:\n    mode: install\n"
            "    release: kube-prometheus-stack\n    namespace: monitoring\n")
