# One module: one pass from a cluster's state to the files that reproduce it; pools, names and texts are its steps.
"""`gpushare import`: a cluster's GPU sharing turned into an environment file and sharing profiles that reproduce
it. Pools group nodes with the same GPU model, configs, taints and driver; profiles are named after the configs
they came from; tenants come from quotas and Kueue queues. What gpushare cannot express is never dropped in
silence: it goes to `unsupported` (the report, and comments at the top of the environment file)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import date
from functools import cache
from pathlib import Path
from typing import Any, cast

from gpushare.core import spec
from gpushare.core.catalog import GpuModel
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import yaml_text
from gpushare.core.guardrails import load_guardrails
from gpushare.core.mappings import dig
from gpushare.core.paths import package_data_path
from gpushare.core.resolve import ResolvedFleet, advertised_per_gpu
from gpushare.core.spec import PROFILE_ADAPTER, is_system_namespace, version_tuple
from gpushare.ops.brownfield.cluster import (
    COUNT_LABEL,
    DEVICE_PLUGIN_LABEL,
    DRIVER_LABEL,
    MIG_DISABLED,
    MIG_PARTED_KEY,
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
    quantity,
    sharing_config,
    tenant_namespaces,
    valid_name,
)
from gpushare.ops.brownfield.operator import operator_changes

FALLBACK_DRIVER = 570
# Taints Kubernetes itself sets: never a pool's.


@cache
def fallback_toolkit() -> str:
    """The toolkit version imported where the ClusterPolicy names none (reported, and `gpushare check` judges it):
    the CVE floor of the guardrails `gpushare init` writes (gpushare/data/workspace/policies/guardrails.yaml), the
    one place that floor is defined."""
    return load_guardrails(package_data_path("workspace", "policies", "guardrails.yaml")).toolkit.min_version


def _most(model: type[Any]) -> int:
    """The upper bound of a profile's `replicas` (spec.TimeSlicingSpec, spec.MpsSpec), as validation holds it."""
    from annotated_types import Le

    return next(int(cast(int, m.le)) for m in model.model_fields["replicas"].metadata if isinstance(m, Le))


_MOST_REPLICAS = {"time-slicing": _most(spec.TimeSlicingSpec), "mps": _most(spec.MpsSpec)}
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
    mapping: dict[str, list[str]]  # "mig.config=NAME" / "device-plugin.config=NAME" -> the profiles it became
    unsupported: list[Unsupported]
    nodes: list[ImportedNode] = field(default_factory=list)
    # The Helm release (namespace, name) that installed the running GPU Operator, from its ClusterPolicy's
    # meta.helm.sh annotations; None where Helm did not (or the dump does not say).
    operator_release: tuple[str, str] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"environment": self.environment, "files": sorted(self.files), "mapping": self.mapping,
                "unsupported": [u.as_dict() for u in self.unsupported]}


@dataclass(frozen=True)
class Sharing:
    """What a device-plugin config does on one node: only the resources the node advertises are shared."""

    kind: str  # exclusive, time-slicing or mps
    replicas: int = 1
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False


class _Importer:
    def __init__(self, state: ClusterState, env: str) -> None:
        self.state = state
        self.env = env
        self.unsupported: list[Unsupported] = []
        self.profiles: dict[str, dict[str, Any]] = {}
        self.profile_keys: dict[tuple[Any, ...], str] = {}
        self.uses: dict[str, set[str]] = {}  # "label=config" -> profiles
        self.spec = self.state.policy_spec
        self.cp_name = f"ClusterPolicy/{name_of(self.state.cluster_policy)}"
        self.strategy = self.mig_strategy()
        self.dp_source = self.state.device_plugin_source()
        self.mig_source = self.state.mig_source()
        self.sharing: dict[str, SharingConfig] = {
            name: sharing_config(name, data, self.unsupported, f"ConfigMap/{self.dp_source.configmap}")
            for name, data in self.dp_source.configs.items()}
        self.mig: dict[str, list[dict[str, Any]]] = self.mig_source.configs
        self.kept_priority_classes: dict[str, str] = {}

    def note(self, obj: str, where: str, reason: str) -> None:
        self.unsupported.append(Unsupported(obj, where, reason))

    @property
    def mapping(self) -> dict[str, list[str]]:
        return {k: sorted(v) for k, v in sorted(self.uses.items())}

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
        sharing, dp_name = self.node_sharing(obj, node)
        if sharing is None:
            return None
        profile = self.profile_for(obj, model, layout, mig_name, sharing, dp_name)
        if profile is None:
            return None
        self.check_allocatable(obj, node, profile, model, int(count))
        self.host_notes(obj, node, int(count))
        driver = self.driver(labels)
        return ImportedNode(name=name, address=address, model=model, gpu_count=int(count), driver=driver,
                            profile=profile, taints=self.taints(node), mig_config=mig_name,
                            device_plugin_config=dp_name)

    def host_notes(self, obj: str, node: dict[str, Any], count: int) -> None:
        provider = str(dig(node, "spec", "providerID", default=""))
        if provider.startswith(("gce://", "aws://")):
            self.note(obj, "spec.providerID", f"a cloud node ({provider.split(':')[0]}): imported as a bare-metal "
                      "host; gpushare makes cloud node pools through Pulumi, so move it to a cloud pool by hand")
        if count == 8:
            self.note(obj, "nvswitch", "the cluster does not show whether an 8-GPU host is an HGX system with "
                      "NVSwitch; set nvswitch: true on the host if it is (it then needs nvidia-fabricmanager)")

    def node_layout(self, obj: str, labels: dict[str, str], model: GpuModel
                    ) -> tuple[bool, dict[str, int] | None, str | None]:
        """(importable, layout, config name) from the mig-parted config the node's label names, read from the
        ConfigMap mig-manager mounts (never another one)."""
        name = labels.get(OPERATOR_MIG_LABEL)
        if name is None or not model.mig_capable:
            return True, None, None
        state = labels.get(OPERATOR_STATE_LABEL, "unknown")
        if state != "success":
            self.note(obj, f"labels[{OPERATOR_STATE_LABEL}]", f"MIG config {name!r} is {state} on this node: the "
                      "import takes the layout the label asks for, which the node does not run yet")
        entries = self.mig.get(name)
        if entries is None and name == MIG_DISABLED:
            return True, None, name
        if entries is None:
            source = self.mig_source
            why = source.why_missing(name)
            if not source.problem and name not in source.broken:
                why = why.replace(" lacks it", ", the one mig-manager reads, lacks it")
            self.note(obj, f"labels[{OPERATOR_MIG_LABEL}]", f"MIG config {name!r}: {why}; the node is left out")
            return False, None, name
        if mig_entries_partial(entries):
            self.note(obj, f"labels[{OPERATOR_MIG_LABEL}]", f"MIG config {name!r} gives some GPUs another layout "
                      "(devices: [...]); gpushare gives every GPU of a node one layout; the node is left out")
            return False, None, name
        return True, mig_layout(entries, model) or None, name

    def node_sharing(self, obj: str, node: dict[str, Any]) -> tuple[SharingConfig | None, str | None]:
        """The device-plugin config the node runs, as the operator's config-manager picks it."""
        labelled = labels_of(node).get(DEVICE_PLUGIN_LABEL)
        name = self.state.device_plugin_config_for(node)
        if self.dp_source.configmap is None:
            if labelled:
                self.note(obj, f"labels[{DEVICE_PLUGIN_LABEL}]", f"names config {labelled!r}, but the ClusterPolicy "
                          f"mounts no device-plugin ConfigMap ({self.dp_source.named_by} is unset), so the plugin "
                          "ignores the label and runs unshared; imported unshared")
            return SharingConfig(name="", kind="exclusive"), None
        if name is None:
            return SharingConfig(name="", kind="exclusive"), None
        found = self.sharing.get(name)
        if found is None:
            why = self.dp_source.why_missing(name)
            self.note(obj, f"labels[{DEVICE_PLUGIN_LABEL}]", f"device-plugin config {name!r}: {why}; the node is "
                      "left out")
        return found, name

    def effective(self, obj: str, sharing: SharingConfig, layout: dict[str, int] | None) -> Sharing | None:
        """What the config shares on this node: the device plugin shares only the resources the config names, and
        under the mixed strategy a MIG node advertises nvidia.com/mig-<profile>, not nvidia.com/gpu. None where
        gpushare cannot express it (noted)."""
        if sharing.kind == "exclusive":
            return Sharing("exclusive")
        if layout is None or self.strategy == "single":
            advertised = ["nvidia.com/gpu"]
        else:
            advertised = sorted(f"nvidia.com/mig-{p.replace('+', '.')}" for p in layout)
        shared = {r: n for r, n in sharing.per_resource.items() if r in advertised}
        if not shared:
            return Sharing("exclusive")
        where = f"labels[{DEVICE_PLUGIN_LABEL}]"
        if set(shared) != set(advertised) or len(set(shared.values())) > 1 or set(shared) & sharing.inexpressible:
            told = ", ".join(f"{r} x{n}" for r, n in sorted(shared.items()))
            self.note(obj, where, f"config {sharing.name!r} shares {told} of the node's {', '.join(advertised)}"
                      f"{' (with its own rename or device list)' if set(shared) & sharing.inexpressible else ''}; "
                      "gpushare shares every resource of a node alike, with one count; the node is left out")
            return None
        replicas = next(iter(shared.values()))
        if replicas < 2:
            self.note(obj, where, f"config {sharing.name!r} shares with 1 replica, which is exclusive use; imported "
                      "as exclusive")
            return Sharing("exclusive")
        most = _MOST_REPLICAS[sharing.kind]
        if replicas > most:
            self.note(obj, where, f"config {sharing.name!r} in ConfigMap {self.dp_source.configmap!r} shares "
                      f"{', '.join(sorted(shared))} with replicas {replicas}; a gpushare {sharing.kind} profile "
                      f"allows at most {most}; the node is left out")
            return None
        return Sharing(sharing.kind, replicas, sharing.rename_by_default, sharing.fail_requests_greater_than_one)

    def check_allocatable(self, obj: str, node: dict[str, Any], profile: str, model: GpuModel, count: int) -> None:
        """The import plans what the node's labels and configs ask for; say so where the node allocates else."""
        status = node.get("status") or {}
        planned = {r: n * count for r, n in self.advertised(profile, model).items()}
        shown = ", ".join(f"{r}={n}" for r, n in sorted(planned.items()))
        if "allocatable" not in status:
            self.note(obj, "status.allocatable", f"not in the dump: the plan ({shown}) is not checked against what "
                      "the node allocates")
            return
        have = gpu_resources(status["allocatable"] or {})
        if have == planned:
            return
        labels = labels_of(node)
        state = labels.get(OPERATOR_STATE_LABEL, "success")
        if OPERATOR_MIG_LABEL in labels and model.mig_capable and state != "success":
            why = f"its MIG change to {labels[OPERATOR_MIG_LABEL]!r} is {state}"
        else:
            why = ("its config is applied but has not taken effect (gpu-operator #1144: restart the device plugin), "
                   "or it shares in a way the import does not see")
        allocates = ", ".join(f"{r}={n}" for r, n in sorted(have.items())) or "no GPU resource"
        self.note(obj, "status.allocatable", f"the node allocates {allocates}; the import plans {shown}, what its "
                  f"labels and configs ask for: {why}. A rollout makes the node allocate the plan")

    def advertised(self, profile: str, model: GpuModel) -> dict[str, int]:
        """What one GPU of this model advertises under the imported profile, as the resolver will name it."""
        cluster = spec.Cluster.model_validate({"name": self.env, "kind": "bare-metal", "kubernetes_version": "1.31",
                                               "mig_strategy": self.strategy})
        data = self.profiles[profile]
        layout = None
        if "mig" in data:
            text = data["mig"]["layouts"][model.name]
            layout = {p: int(c) for p, c in (item.split("=") for item in text.split(","))}
        return advertised_per_gpu(spec.PROFILE_ADAPTER.validate_python(data), layout, cluster, False)[0]

    def driver(self, labels: dict[str, str]) -> int:
        text = labels.get(DRIVER_LABEL) or str(dig(self.spec, "driver", "version", default="")).split(".")[0]
        return int(text) if text.isdigit() and 450 <= int(text) <= 999 else FALLBACK_DRIVER

    def taints(self, node: dict[str, Any]) -> tuple[tuple[str, str, str], ...]:
        found = []
        for taint in dig(node, "spec", "taints") or []:
            key = str(taint.get("key", ""))
            if not key.startswith(SYSTEM_TAINT_PREFIXES):
                found.append((key, str(taint.get("value", "") or ""), str(taint.get("effect", "NoSchedule"))))
        return tuple(sorted(found))

    # -- profiles

    def profile_for(self, obj: str, model: GpuModel, layout: dict[str, int] | None, mig_name: str | None,
                    config: SharingConfig, dp_name: str | None) -> str | None:
        sharing = self.effective(obj, config, layout)
        if sharing is None:
            return None
        kind = sharing.kind
        if layout is not None:
            if kind == "mps":
                self.note(obj, f"labels[{DEVICE_PLUGIN_LABEL}]", "MPS on MIG devices is not supported by the device "
                          "plugin; the node is left out")
                return None
            kind = "mig-time-slicing" if kind == "time-slicing" else "mig"
        sources = (mig_name if layout is not None else None, dp_name if kind not in ("exclusive", "mig") else None)
        key = (*sources, kind, sharing)
        name = self.profile_keys.get(key) or self.new_profile(key, sources, kind, sharing)
        profile = self.profiles[name]
        if layout is not None:
            text = ",".join(f"{p}={n}" for p, n in sorted(layout.items()))
            profile["mig"]["layouts"][model.name] = text
        # Every config the node uses maps to its profile, also one that shares nothing here (all-disabled, a
        # time-slicing config naming resources a MIG node does not advertise).
        for label, used in (("mig.config", mig_name), ("device-plugin.config", dp_name)):
            if used:
                self.uses.setdefault(f"{label}={used}", set()).add(name)
        return name

    def new_profile(self, key: tuple[Any, ...], sources: tuple[str | None, str | None], kind: str, sharing: Sharing
                    ) -> str:
        base = valid_name("-".join(p for p in sources if p) or "exclusive", 30)
        name, n = base, 2
        while name in self.profiles:
            name, n = f"{base[:27]}-{n}", n + 1
        described = " and ".join(f"{what} {p!r}" for what, p in zip(("mig-parted config", "device-plugin config"),
                                                                    sources, strict=True) if p)
        profile: dict[str, Any] = {"name": name, "kind": kind,
                                   "description": f"Imported from {described or 'whole GPUs (no sharing config)'}."}
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

    def mig_strategy(self) -> str:
        strategy = dig(self.spec, "mig", "strategy", default="single")
        if strategy not in ("single", "mixed"):
            self.note(self.cp_name, "spec.mig.strategy", f"{strategy!r} is not single or mixed; imported as mixed")
            return "mixed"
        return str(strategy)

    def cluster(self, nodes: list[dict[str, Any]]) -> dict[str, Any]:
        cdi = dig(self.spec, "cdi", "enabled", default=True)
        return {"name": self.env, "kind": "bare-metal", "kubernetes_version": kubernetes_minor(nodes),
                "mig_strategy": self.strategy, "cdi": bool(cdi)}

    def toolkit_version(self, floor: str | None = None) -> str:
        """The toolkit the cluster runs; below the guardrails' CVE floor (a rule no waiver covers), the floor: the
        first rollout's remediation, said in the report."""
        text = str(dig(self.spec, "toolkit", "version", default=""))
        found = re.match(r"v?(\d+\.\d+\.\d+)", text)
        if found is None:
            version = fallback_toolkit()
            self.note(self.cp_name, "spec.toolkit.version", f"no toolkit version; imported as {version} "
                      "(`gpushare check` judges it against the CVE floor)")
        else:
            version = found.group(1)
        if floor and version_tuple(version) < version_tuple(floor):
            self.note(self.cp_name, "spec.toolkit.version", f"REMEDIATION: the cluster runs toolkit {version}, "
                      f"below the CVE floor {floor} (toolkit-cve-floor, which no waiver may cover); imported as "
                      f"{floor}: the first rollout upgrades it on every host (Ansible, host by host behind the "
                      "canary gates; running containers keep the runtime they started with)")
            return floor
        return version

    def monitoring(self) -> dict[str, Any]:
        """The Pulumi stack's monitoring: a Prometheus stack the cluster runs (dcgm-exporter's ServiceMonitor on in
        the ClusterPolicy, or prometheus-operator objects in the dump) is reused, never installed twice."""
        monitor = dig(self.spec, "dcgmExporter", "serviceMonitor") or {}
        kinds = {what.split("/")[0] for what, _ in self.state.unknown}
        if monitor.get("enabled") is True or kinds & {"Prometheus", "ServiceMonitor", "PodMonitor",
                                                       "PrometheusRule"}:
            release = str(dig(monitor, "additionalLabels", "release") or "kube-prometheus-stack")
            self.note(self.cp_name, "spec.dcgmExporter.serviceMonitor", f"a Prometheus stack runs (release label "
                      f"{release!r}): reused (gpushare:monitoring mode existing), never installed beside it; check "
                      f"the release and namespace in the stack file")
            return {"mode": "existing", "release": release, "namespace": "monitoring"}
        return {"mode": "install", "release": "kube-prometheus-stack", "namespace": "monitoring"}

    def priority_classes(self, wanted: dict[str, tuple[int, str]]) -> dict[str, str]:
        """The cluster's own PriorityClasses with the value and preemption policy of gpushare's online and batch
        (`wanted`): kept in their place (adoption.priority_classes), never a second class of the same value."""
        found: dict[str, str] = {}
        for priority, (value, preemption) in sorted(wanted.items()):
            same = sorted(name_of(o) for o in self.state.of("PriorityClass") if not name_of(o).startswith("system-")
                          and o.get("value") == value
                          and (o.get("preemptionPolicy") or "PreemptLowerPriority") == preemption)
            if same and is_dns_label(same[0]):
                found[priority] = same[0]
                self.note(f"PriorityClass/{same[0]}", "value", f"{value} ({preemption}), as gpushare's {priority} "
                          f"priority: kept in its place (adoption.priority_classes.{priority}); tenants' pods keep "
                          "naming it")
        self.kept_priority_classes = found
        return found

    def kueue_runs(self) -> bool:
        return any(self.state.of(kind) for kind in ("ClusterQueue", "LocalQueue", "ResourceFlavor"))

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
            self.note(f"Namespace/{namespace}", "trust", "imported as trusted, as the cluster treats the team today "
                      "(any of its pods may use any GPU): untrusted (hardware-isolated GPUs only, admission "
                      "enforced) is a later, reviewed step (docs/adoption.md)")
            tenant: dict[str, Any] = {"name": namespace, "namespace": namespace, "trust": "trusted",
                                      "priority": "batch", "quota": quota}
            if borrowing:
                tenant["borrowing_limit"] = borrowing
            level = self.pod_security_level(namespace)
            if level:
                tenant["pod_security"] = level
            quota_name = self.gpu_quota_name(namespace)
            if quota_name:
                tenant["quota_name"] = quota_name
            out.append(tenant)
        return out

    def pod_security_level(self, namespace: str) -> str | None:
        """The Pod Security level the namespace enforces today, where gpushare can keep it (restricted, baseline);
        none or privileged: gpushare's default for a trusted tenant (baseline), staged by adoption.pod_security."""
        for ns in self.state.of("Namespace"):
            if name_of(ns) == namespace:
                level = labels_of(ns).get("pod-security.kubernetes.io/enforce")
                if level in ("restricted", "baseline"):
                    return level
                if level is not None:
                    self.note(f"Namespace/{namespace}", "labels[pod-security.kubernetes.io/enforce]",
                              f"{level!r}: gpushare never sets privileged; its baseline warns and audits until "
                              "adoption.pod_security is enforce, which the running pods must meet first")
        return None

    def gpu_quota_name(self, namespace: str) -> str | None:
        """The namespace's one ResourceQuota with GPU limits, which gpushare takes over in place (never a second
        quota beside it); None where there is none or several (noted)."""
        found = [name_of(q) for q in self.state.of("ResourceQuota")
                 if dig(q, "metadata", "namespace") == namespace and gpu_resources(dig(q, "spec", "hard") or {})]
        if len(found) > 1:
            self.note(f"Namespace/{namespace}", "ResourceQuota", f"{len(found)} quotas hold GPU limits "
                      f"({', '.join(sorted(found))}): gpushare adds gpushare-gpu-quota with their sum; merge them "
                      "into one and set the tenant's quota_name to keep it")
            return None
        return found[0] if found else None

    def namespace_quota(self, namespace: str) -> tuple[dict[str, int], dict[str, int]]:
        """Kueue's nominal quota and borrowing limit where a LocalQueue serves the namespace, else the
        ResourceQuota's GPU limits."""
        queues = [q for q in self.state.of("LocalQueue") if dig(q, "metadata", "namespace") == namespace]
        for q in self.state.of("ResourceQuota"):
            if dig(q, "metadata", "namespace") != namespace:
                continue
            hard = dig(q, "spec", "hard") or {}
            for key in sorted(k for k in hard if not k.removeprefix("requests.").startswith("nvidia.com/")):
                self.note(f"ResourceQuota/{namespace}/{name_of(q)}", f"spec.hard[{key}]", "not a GPU resource; "
                          "gpushare manages GPU quotas only, so keep this quota outside gpushare")
        if queues:
            return self.queue_quota(namespace, queues)
        quota: dict[str, int] = {}
        for q in self.state.of("ResourceQuota"):
            if dig(q, "metadata", "namespace") == namespace:
                quota.update(gpu_resources(dig(q, "spec", "hard") or {}))
        return quota, {}

    def queue_quota(self, namespace: str, queues: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, int]]:
        quota: Counter[str] = Counter()
        borrowing: Counter[str] = Counter()
        wanted = {str(dig(q, "spec", "clusterQueue")) for q in queues}
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
                        if not rname.startswith("nvidia.com/"):
                            continue
                        nominal, limit = quantity(res.get("nominalQuota", 0)), quantity(res.get("borrowingLimit") or 0)
                        if nominal is None or limit is None:
                            self.note(f"ClusterQueue/{name_of(cq)}", f"spec.resourceGroups[{rname}]", "a GPU quota "
                                      "that is not a whole number; left out (GPUs are counted whole)")
                            continue
                        quota[rname] += nominal
                        borrowing[rname] += limit
        return dict(quota), {k: v for k, v in borrowing.items() if v}

    def leftovers(self, used_sharing: set[str], used_mig: set[str], driver: int, toolkit: str) -> None:
        if not self.state.of("ClusterPolicy"):
            self.note("ClusterPolicy", "spec", "not in the dump: the import cannot tell which ConfigMaps the operator "
                      "mounts, so it reads none; dump it too (kubectl get clusterpolicies -o yaml)")
        for name in sorted(set(self.sharing) - used_sharing):
            self.note(f"ConfigMap/{self.dp_source.configmap}", name, "config no node uses; not imported")
        for name in sorted(set(self.mig) - used_mig - {MIG_DISABLED}):
            self.note(f"ConfigMap/{self.mig_source.configmap}", name, "config no node uses; not imported")
        named = {self.state.device_plugin_config_for(n) for n in self.state.gpu_nodes()}
        named |= {labels_of(n).get(OPERATOR_MIG_LABEL) for n in self.state.gpu_nodes()}
        for source in (self.dp_source, self.mig_source):
            for name, why in sorted(source.broken.items()):
                if name not in named:  # a node that names it was noted already
                    self.note(f"ConfigMap/{source.configmap}", name, f"config no node uses, which cannot be read "
                              f"({why}); not imported")
        # A mounted ConfigMap that cannot be read at all (its config.yaml not YAML, mig-configs not a mapping) is
        # said where a node names one of its configs; where none does, here.
        for source in (self.dp_source, self.mig_source):
            if source.problem and source.file is not None and not any(
                    source.problem in u.reason for u in self.unsupported):
                key = MIG_PARTED_KEY if source is self.mig_source else "data"
                self.note(f"ConfigMap/{source.configmap}", key, f"{source.named_by} names it, but {source.problem}; "
                          "no config of it is imported")
        for cm, holds in self.state.unread_config_maps():
            self.note(f"ConfigMap/{cm}", "data", f"holds {holds}, but the ClusterPolicy mounts "
                      f"{self.mig_source.configmap!r} for mig-manager and "
                      f"{self.dp_source.configmap or 'no ConfigMap'!r} for the device plugin: no node reads these; "
                      "not imported")
        for change in operator_changes(self.spec, self.env, driver, toolkit):
            self.note(self.cp_name, f"spec.{change.path}", change.reason)
        for obj in self.state.of("NVIDIADriver"):
            self.note(f"NVIDIADriver/{name_of(obj)}", "spec", "per-pool driver objects: gpushare pins one driver "
                      "branch per environment or host (driver_branch)")
        kept = set(self.kept_priority_classes.values())
        for obj in self.state.of("PriorityClass"):
            if not name_of(obj).startswith("system-") and name_of(obj) not in kept:
                self.note(f"PriorityClass/{name_of(obj)}", "value", "gpushare has two priorities, online and batch; "
                          "map tenants to them by hand")
        for what, where in self.state.unknown:
            self.note(what, where, "object kind the import does not read")
        for ns in {str(dig(o, "metadata", "namespace", default="")) for o in self.state.of("ResourceQuota")}:
            if ns and is_system_namespace(ns):
                self.note(f"Namespace/{ns}", "ResourceQuota", "a system namespace is never a tenant")


def import_cluster(state: ClusterState, env: str, existing: dict[str, Any] | None = None,
                   context: str | None = None, toolkit_floor: str | None = None,
                   today: date | None = None, priorities: dict[str, tuple[int, str]] | None = None) -> ImportResult:
    """The workspace files (environment, profiles, Pulumi stack) that reproduce the cluster. `existing`: the
    workspace's profiles by name; an imported profile equal to one of them is reused, never overwritten.
    `context`: the kubeconfig context the cluster was read through, written on the cluster. `toolkit_floor`: the
    guardrails' CVE floor, which an older toolkit is raised to (reported). The environment is an adopted one
    (its `adoption:` block stages admission, Pod Security, the shared-GPU taint and host defaults)."""
    imp = _Importer(state, env)
    gpu_nodes = state.gpu_nodes()
    nodes = [n for n in (imp.node(node) for node in gpu_nodes) if n is not None]
    if not nodes:
        raise GpushareError(Problem(
            f"no GPU node to import in {state.source}: an environment needs at least one pool",
            file=str(state.source), fix="dump the cluster's nodes too (`kubectl get nodes -o yaml "
            "--show-managed-fields > DIR/nodes.yaml`, see docs/adoption.md), or point at the right cluster"),
            exit_code=2)
    advertised = {r for n in nodes for r in imp.advertised(n.profile, n.model)}
    reused = _settle_names(imp, nodes, existing or {})
    driver = Counter(n.driver for n in nodes).most_common(1)[0][0] if nodes else FALLBACK_DRIVER
    toolkit = imp.toolkit_version(toolkit_floor)
    kept_classes = imp.priority_classes(priorities or {})
    imp.leftovers({n.device_plugin_config for n in nodes if n.device_plugin_config},
                  {n.mig_config for n in nodes if n.mig_config}, driver, toolkit)
    pools = _pools(nodes, imp.profiles, env, driver)
    # The device-plugin configs nodes name today, kept in gpushare's ConfigMap under their own names until each
    # node's rollout batch relabels it (the rollout's prune step drops them after the last batch).
    adopted = {name: f"imports/{env}-configs/{name}.yaml"
               for name in sorted({n.device_plugin_config for n in nodes if n.device_plugin_config})
               if name in imp.dp_source.configs}
    cluster = imp.cluster(gpu_nodes)
    if context:
        cluster["kubeconfig_context"] = context
    environment: dict[str, Any] = {
        "apiVersion": "gpushare.io/v1", "kind": "Environment", "name": env,
        "description": f"Imported from a running cluster ({state.source}); review before the first rollout.",
        # Every guard that would change what runs is staged; each moves in a reviewed step (docs/adoption.md).
        "adoption": {"imported": (today or date.today()).isoformat(), "admission": "warn", "pod_security": "warn",
                     "shared_gpu_taint": False, "host_defaults": False,
                     **({"priority_classes": kept_classes} if kept_classes else {})},
        "defaults": {"driver_branch": driver, "toolkit_version": toolkit},
        "clusters": [cluster], "pools": pools, "tenants": imp.tenants(advertised)}
    files = {f"environments/{env}.yaml": _environment_text(environment, imp.unsupported, state.source),
             f"Pulumi.{env}.yaml": _stack_text(env, imp.monitoring(), imp.kueue_runs(), adopted)}
    for name, rel in adopted.items():
        files[rel] = (f"# {name} of ConfigMap {imp.dp_source.configmap}, as the cluster ran it when `gpushare import` "
                      "read it:\n# kept under this name until no node names it (docs/adoption.md).\n"
                      + _dump(imp.dp_source.configs[name]))
    for name, profile in sorted(imp.profiles.items()):
        if name in reused:
            continue
        files[f"profiles/{name}.yaml"] = _dump({"apiVersion": "gpushare.io/v1", **profile})
    files[f"imports/{env}-report.yaml"] = _dump({"environment": env, "source": state.source,
                                                 "mapping": imp.mapping,
                                                 "unsupported": [u.as_dict() for u in imp.unsupported]})
    annotations = dig(state.cluster_policy, "metadata", "annotations") or {}
    release = (str(annotations.get("meta.helm.sh/release-namespace", "")),
               str(annotations.get("meta.helm.sh/release-name", "")))
    return ImportResult(env, files, imp.mapping, imp.unsupported, nodes,
                        operator_release=release if all(release) else None)


def _settle_names(imp: _Importer, nodes: list[ImportedNode], existing: dict[str, Any]) -> set[str]:
    """Rename imported profiles whose name the workspace already uses for something else; the names of those
    equal to a workspace profile (all but the description), which are reused."""
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
    imp.uses = {k: {renames.get(v, v) for v in used} for k, used in imp.uses.items()}
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


def _dump(data: Any) -> str:
    return yaml_text(data)


def _environment_text(environment: dict[str, Any], unsupported: list[Unsupported], source: str) -> str:
    lines = [f"# Written by `gpushare import` from {source}: the cluster's GPU sharing as gpushare expresses it.",
             "# Review trust, priority and purpose (the cluster does not say them) before the first rollout."]
    if unsupported:
        lines.append("# Not expressed here (also in imports/ and in `gpushare import --json`):")
        lines += [f"#   {u.object} {u.field}: {u.reason}" for u in unsupported]
    return "\n".join(lines) + "\n" + _dump(environment)


def _stack_text(env: str, monitoring: dict[str, Any], kueue_runs: bool, adopted: dict[str, str]) -> str:
    text = ("config:\n  # The fleet this stack makes true (written by `gpushare import`).\n"
            f"  gpushare:environment: environments/{env}.yaml\n"
            f"  # {'The cluster runs a Prometheus stack: reused.' if monitoring['mode'] == 'existing' else ''}\n"
            f"  gpushare:monitoring:\n    mode: {monitoring['mode']}\n"
            f"    release: {monitoring['release']}\n    namespace: {monitoring['namespace']}\n")
    if kueue_runs:
        text += "  # The cluster runs Kueue: gpushare adds its queues, never a second Kueue.\n" \
                "  gpushare:kueue:\n    mode: existing\n"
    if adopted:
        text += ("  # The cluster's device-plugin configs its nodes name today, kept under their names until the\n"
                 "  # rollout has relabelled every node (its prune step removes this list).\n"
                 "  gpushare:keepDevicePluginConfigs:\n")
        text += "".join(f"    - name: {name}\n      file: {rel}\n      adopted: true\n"
                        for name, rel in adopted.items())
    return text.replace("  # \n", "")


# The release gpushare's stack installs the GPU Operator as (program/components/nvidia_stack.py).
OPERATOR_RELEASE = ("gpu-operator", "gpu-operator")


def operator_takeover(release: tuple[str, str] | None, env: str, cluster: str) -> str | None:
    """The step that brings a running GPU Operator's Helm release into the stack before the first `pulumi up`, so
    that it is upgraded in place, never installed a second time beside it."""
    if release is None:
        return None
    namespace, name = release
    resource = f"{cluster}-nvidia-gpu-operator"
    parent = f"urn:pulumi:{env}::gpushare::pulumi:pulumi:Stack$gpushare:nvidia:NvidiaStack::{cluster}-nvidia"
    if release != OPERATOR_RELEASE:
        return (f"REMEDIATION: the GPU Operator runs as Helm release {name!r} in namespace {namespace!r}, and gpushare "
                f"installs it as {OPERATOR_RELEASE[1]!r} in {OPERATOR_RELEASE[0]!r}, and cannot take over a release "
                "of another name: the first `pulumi up` would install a second operator beside it, which must never "
                "run. Do not roll out until the running operator is that release (a maintenance window: NVIDIA's "
                "upgrade guide), then import it as docs/adoption.md says")
    return (f"before the first `pulumi up`, bring the running release into the stack (upgraded in place, never "
            f"installed twice): pulumi import -s {env} kubernetes:helm.sh/v3:Release {resource} "
            f"{namespace}/{name} --parent 'parent={parent}'")


def still_needed(workspace: Path, fleet: ResolvedFleet) -> list[str]:
    """What `gpushare check` will still ask for before the imported environment passes, which the cluster cannot
    say: how to reach each cluster, and guardrail limits for the new environment (the workspace's own file, which
    the import never overwrites)."""
    env = fleet.environment
    todo = [f"set kubeconfig_context on cluster {c.name!r} in environments/{env}.yaml (or "
            f"gpushare:clusters.{c.name}.kubeconfigContext in Pulumi.{env}.yaml): the context check and the rollout "
            "reach it through" for c in fleet.clusters.values() if not c.kubeconfig_context]
    try:
        limits = load_guardrails(workspace / "policies" / "guardrails.yaml").environments
    except GpushareError as err:
        return [*todo, f"fix policies/guardrails.yaml, which check reads: {err.problems[0]}"]
    if env not in limits:
        todo.append(f"add limits for environment {env!r} under environments: in policies/guardrails.yaml (copy "
                    f"{'prod' if 'prod' in limits else 'an existing environment'}'s to start strict)")
    return todo
