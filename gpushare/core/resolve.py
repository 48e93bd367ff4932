# One module: the resolved types and the one pass that fills them, so a field and what sets it sit together.
"""Environment + profiles -> the resolved fleet: what every node and every GPU becomes.

Consumers (renderers, the Pulumi program, the Ansible inventory, the CLI) read this model and never
re-derive GPU geometry or sharing semantics themselves."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.core import dra_facts as dra  # the DRA vocabulary; gpushare.core.dra compiles the resolved fleet
from gpushare.core import kubeversions, spec
from gpushare.core.catalog import GpuModel, load_catalog
from gpushare.core.cloud_pools import CloudPool
from gpushare.core.cloud_pools import refusals as cloud_refusals
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.labels import Label, ManagedBy, Owner, config_labels, identity_labels
from gpushare.core.loading import Located
from gpushare.core.mig import check_layout, layout_counts, layout_from_counts, parse_layout
from gpushare.core.paths import default_profiles_dir, environment_path

MIG_DISABLED = "all-disabled"
# GKE's own plugin advertises shared and whole GPUs alike as nvidia.com/gpu: only trusted tenants tolerate this.
SHARED_GPU_TAINT = spec.Taint(key="gpushare.io/shared-gpu", value="true", effect="NoSchedule")


@dataclass
class ResolvedNode:
    name: str
    pool: str
    cluster: str
    cluster_kind: str
    managed_by: ManagedBy
    address: str | None
    count: int  # 1 for a bare-metal host; the node count of a cloud node pool
    gpu_model: GpuModel
    gpus_per_node: int
    driver_branch: int
    profile: str
    sharing: str
    isolation: str
    mig_layout: dict[str, int] | None  # per GPU; None when MIG is off
    mig_config: str | None  # mig-parted config name; None on GPUs without MIG
    device_plugin_config: str | None  # None where GKE's own plugin serves the node
    labels: dict[str, Label]
    taints: list[spec.Taint]
    advertised: dict[str, int]  # per node
    hardware_units: int  # per node
    nvswitch: bool = False
    containerd_version: str = ""
    toolkit_version: str = ""

    @property
    def physical_gpus(self) -> int:
        return self.gpus_per_node

    def labels_owned_by(self, owner: Owner) -> dict[str, str]:
        return {k: v.value for k, v in self.labels.items() if v.owner == owner}


@dataclass
class Totals:
    physical_gpus: int = 0
    hardware_units: int = 0
    advertised: dict[str, int] = field(default_factory=dict)

    @property
    def advertised_total(self) -> int:
        return sum(self.advertised.values())

    @property
    def oversubscription(self) -> float:
        return round(self.advertised_total / self.hardware_units, 3) if self.hardware_units else 0.0

    def add(self, gpus: int, units: int, advertised: dict[str, int]) -> None:
        self.physical_gpus += gpus
        self.hardware_units += units
        for name, n in advertised.items():
            self.advertised[name] = self.advertised.get(name, 0) + n

    def as_dict(self) -> dict[str, Any]:
        return {
            "physical_gpus": self.physical_gpus,
            "hardware_units": self.hardware_units,
            "advertised": dict(sorted(self.advertised.items())),
            "advertised_total": self.advertised_total,
            "oversubscription": self.oversubscription,
        }


@dataclass
class ResolvedPool:
    name: str
    cluster: str
    cluster_kind: str
    purpose: str
    profile: str
    sharing: str
    isolation: str
    cloud: spec.CloudNodes | None
    nodes: list[ResolvedNode]
    totals: Totals


@dataclass
class ResolvedTenant:
    name: str
    namespace: str
    trust: str
    priority: str
    clusters: list[str]
    quota: dict[str, int]
    borrowing_limit: dict[str, int]
    pod_security: str  # the Pod Security level enforced on the tenant's namespace
    quota_name: str | None = None  # the namespace's own ResourceQuota gpushare takes over (None: its own)


@dataclass
class DevicePluginConfig:
    name: str
    cluster: str
    content: dict[str, Any]


@dataclass
class ResolvedFleet:
    environment: str
    source: Path
    env: spec.Environment
    profiles: dict[str, Any]  # name -> spec.SharingProfile
    clusters: dict[str, spec.Cluster]
    pools: list[ResolvedPool]
    tenants: list[ResolvedTenant]
    mig_configs: dict[str, dict[str, dict[str, int]]]  # config name -> GPU model name -> layout
    device_plugin_configs: dict[str, DevicePluginConfig]
    totals: Totals
    cluster_totals: dict[str, Totals]
    warnings: list[str]

    @property
    def nodes(self) -> list[ResolvedNode]:
        return [n for p in self.pools for n in p.nodes]

    def pool(self, name: str) -> ResolvedPool:
        return next(p for p in self.pools if p.name == name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "source": str(self.source),
            "totals": self.totals.as_dict(),
            "clusters": {
                name: {"kind": c.kind, "mig_strategy": c.mig_strategy, "cdi": c.cdi,
                       **self.cluster_totals[name].as_dict()}
                for name, c in self.clusters.items()
            },
            "pools": [
                {
                    "name": p.name, "cluster": p.cluster, "cluster_kind": p.cluster_kind, "purpose": p.purpose,
                    "profile": p.profile, "sharing": p.sharing, "isolation": p.isolation, **p.totals.as_dict(),
                    "nodes": [_node_dict(n) for n in p.nodes],
                }
                for p in self.pools
            ],
            "tenants": [t.__dict__ for t in self.tenants],
            "mig_configs": self.mig_configs,
            "device_plugin_configs": {k: {"cluster": v.cluster, "content": v.content}
                                      for k, v in self.device_plugin_configs.items()},
            "warnings": self.warnings,
        }


def _node_dict(n: ResolvedNode) -> dict[str, Any]:
    return {
        "name": n.name, "address": n.address, "count": n.count, "managed_by": n.managed_by,
        "gpu_model": n.gpu_model.name, "gpus_per_node": n.gpus_per_node, "driver_branch": n.driver_branch,
        "profile": n.profile, "sharing": n.sharing, "isolation": n.isolation, "mig_layout": n.mig_layout,
        "mig_config": n.mig_config, "device_plugin_config": n.device_plugin_config,
        "labels": {k: {"value": v.value, "owner": v.owner} for k, v in sorted(n.labels.items())},
        "taints": [t.model_dump() for t in n.taints],
        "advertised": n.advertised, "hardware_units": n.hardware_units,
    }


# ---------------------------------------------------------------- resolution


@dataclass(frozen=True)
class _NodeSource:
    """What the environment file says of one node: a bare-metal host, or a cloud pool's nodes (`count` alike)."""

    name: str
    address: str | None
    count: int
    gpus: int
    gpu_model: str  # as written: an NVML name, alias, slug or PCI id
    gpu_model_loc: tuple[Any, ...]
    driver: int
    profile: str
    profile_loc: tuple[Any, ...]
    nvswitch: bool
    containerd: str


class _Resolver:
    def __init__(self, env: spec.Environment, doc: Located, profiles: dict[str, tuple[spec.SharingProfile, Located]]):
        self.env = env
        self.doc = doc
        self.profiles = profiles
        self.catalog = load_catalog()
        self.problems: list[Problem] = []
        self.warnings: list[str] = []
        self._layout_cache: dict[tuple[str, str, int], tuple[dict[str, int] | None, list[Problem], list[str]]] = {}
        self._model_cache: dict[str, GpuModel | GpushareError] = {}
        self.mig_configs: dict[str, dict[str, dict[str, int]]] = {}
        self.dp_configs: dict[str, DevicePluginConfig] = {}
        # Clusters with a pool that failed to resolve: what they advertise is unknown, so quota checks wait.
        self.incomplete_clusters: set[str] = set()

    def err(self, loc: tuple[Any, ...], message: str, fix: str | None = None) -> None:
        self.problems.append(self.doc.problem(loc, message, fix))

    def model(self, query: str, loc: tuple[Any, ...]) -> GpuModel | None:
        found = self._model_cache.get(query)
        if found is None:
            try:
                found = self.catalog.lookup(query)
            except GpushareError as exc:
                found = exc
            self._model_cache[query] = found
        if isinstance(found, GpushareError):
            self.err(loc, "; ".join(p.message for p in found.problems),
                     fix="use an NVML product name, alias, slug or PCI id; `gpushare gpus` lists every model")
            return None
        return found

    # -- profile -> per-model layout

    def layout_for(self, profile: spec.SharingProfile, model: GpuModel, driver: int, loc: tuple[Any, ...]
                   ) -> tuple[dict[str, int] | None, bool]:
        key = (profile.name, model.name, driver)
        if key not in self._layout_cache:
            self._layout_cache[key] = self._compute_layout(profile, model, driver)
        layout, problems, warnings = self._layout_cache[key]
        for p in problems:
            self.err(loc, p.message, p.fix)
        for w in warnings:
            if w not in self.warnings:
                self.warnings.append(w)
        return layout, not problems

    def _compute_layout(self, profile: spec.SharingProfile, model: GpuModel, driver: int
                        ) -> tuple[dict[str, int] | None, list[Problem], list[str]]:
        if profile.kind not in ("mig", "mig-time-slicing"):
            return None, [], []
        if not model.mig_capable:
            return None, [Problem(f"profile {profile.name!r} uses MIG but {model.name} has no MIG",
                                  fix="use a time-slicing, MPS or exclusive profile for this GPU")], []
        mig: spec.MigSpec = profile.mig
        counts: dict[str, int] | None = None
        if mig.layout is not None:
            counts = generic_layout(model, mig.layout)
        else:
            assert mig.layouts is not None
            for key, text in mig.layouts.items():
                try:
                    target = self.catalog.lookup(key)
                except GpushareError:
                    continue  # reported once by check_profiles
                if target.name == model.name:
                    try:
                        counts = layout_counts(parse_layout(text))
                    except GpushareError as exc:
                        return None, [Problem(f"profile {profile.name!r}: {exc.problems[0].message}")], []
                    break
        if counts is None:
            return None, [Problem(
                f"profile {profile.name!r} has no layout for {model.name}",
                fix=f"add mig.layouts[{model.name!r}] to the profile, or use a model-agnostic layout "
                    "(balanced, all-smallest, whole)")], []
        check = check_layout(model, layout_from_counts(counts), driver)
        problems = [Problem(f"profile {profile.name!r} on {model.name} (driver R{driver}): {e}",
                            fix="change the profile's layout; `gpushare mig validate` shows valid ones")
                    for e in check.errors]
        warnings = [f"{model.name}: {w}" for w in check.warnings]
        return (counts if check.ok else None), problems, warnings

    # -- device-plugin and mig-parted configs

    def device_plugin_config(self, profile: spec.SharingProfile, cluster: spec.Cluster,
                             layout: dict[str, int] | None) -> str:
        content = device_plugin_content(profile, cluster, layout)
        name = f"{profile.name}-{device_plugin_digest(content)}"
        self.dp_configs.setdefault(name, DevicePluginConfig(name=name, cluster=cluster.name, content=content))
        return name

    def mig_config(self, profile: spec.SharingProfile, model: GpuModel, layout: dict[str, int] | None) -> str:
        if layout is None:
            return MIG_DISABLED
        digest = hashlib.sha256(json.dumps([model.name, sorted(layout.items())]).encode()).hexdigest()[:6]
        name = f"{profile.name}-{model.slug}-{digest}"[:63]
        self.mig_configs.setdefault(name, {})[model.name] = dict(layout)
        return name

    # -- the walk

    def run(self, source: Path) -> ResolvedFleet:
        env = self.env
        clusters: dict[str, spec.Cluster] = {}
        for i, c in enumerate(env.clusters):
            if c.name in clusters:
                self.err(("clusters", i, "name"), f"cluster {c.name!r} is defined twice", "rename one")
            clusters[c.name] = c
            unsupported = kubeversions.support_warning(c.name, c.kubernetes_version)
            if unsupported and unsupported not in self.warnings:
                self.warnings.append(unsupported)

        pools: list[ResolvedPool] = []
        seen_pools: set[str] = set()
        host_names: dict[str, str] = {}
        addresses: dict[str, tuple[str, str]] = {}  # machine -> (host, address as written)
        for pi, pool in enumerate(env.pools):
            ploc: tuple[Any, ...] = ("pools", pi)
            if pool.name in seen_pools:
                self.err((*ploc, "name"), f"pool {pool.name!r} is defined twice", "rename one")
            seen_pools.add(pool.name)
            cluster = clusters.get(pool.cluster)
            if cluster is None:
                self.err((*ploc, "cluster"), f"pool {pool.name!r} names unknown cluster {pool.cluster!r}",
                         f"use one of: {', '.join(clusters)}")
                continue
            for hi, host in enumerate(pool.hosts):
                hloc = (*ploc, "hosts", hi)
                if host.name in host_names:
                    other = host_names[host.name]
                    where = "twice in this pool" if other == pool.name else f"in pools {other!r} and {pool.name!r}"
                    self.err((*hloc, "name"), f"host {host.name!r} is listed {where}",
                             "a host belongs to exactly one pool: remove the duplicate")
                else:
                    host_names[host.name] = pool.name
                # By machine, not by spelling: ::ffff:10.0.0.1 is 10.0.0.1, so one host cannot sit in two pools.
                key = spec.address_key(host.address)
                if key in addresses and addresses[key][0] != host.name:
                    other, written = addresses[key]
                    same = "" if written == host.address else f" (written {written} there: the same machine)"
                    self.err((*hloc, "address"),
                             f"address {host.address} of host {host.name!r} is also host {other!r}'s{same}",
                             "give each host its own address")
                addresses.setdefault(key, (host.name, host.address))
            before = len(self.problems)
            resolved = self.pool(pool, ploc, cluster)
            if resolved is not None:
                pools.append(resolved)
            if len(self.problems) > before:
                self.incomplete_clusters.add(cluster.name)

        for ci, c in enumerate(env.clusters):
            if dra.is_dra(c) and c.name not in self.incomplete_clusters:
                self.dra_cluster(c, ci, [n for p in pools if p.cluster == c.name for n in p.nodes])
        tenants = self.tenants(clusters, pools)
        if self.problems:
            raise GpushareError(self.problems)

        totals = Totals()
        cluster_totals = {name: Totals() for name in clusters}
        for p in pools:
            totals.add(p.totals.physical_gpus, p.totals.hardware_units, p.totals.advertised)
            cluster_totals[p.cluster].add(p.totals.physical_gpus, p.totals.hardware_units, p.totals.advertised)
        return ResolvedFleet(
            environment=env.name, source=source, env=env,
            profiles={k: v[0] for k, v in self.profiles.items()}, clusters=clusters, pools=pools,
            tenants=tenants, mig_configs=self.mig_configs, device_plugin_configs=self.dp_configs,
            totals=totals, cluster_totals=cluster_totals, warnings=self.warnings,
        )

    def pool(self, pool: spec.Pool, ploc: tuple[Any, ...], cluster: spec.Cluster) -> ResolvedPool | None:
        is_cloud = cluster.kind in ("gke", "eks")
        if is_cloud and pool.cloud is None:
            self.err((*ploc, "hosts"), f"pool {pool.name!r} is in {cluster.kind} cluster {cluster.name!r} "
                     "but lists bare-metal hosts", "bare-metal hosts cannot join a cloud cluster: give the "
                     "pool a 'cloud' block or move it to a bare-metal cluster")
            return None
        if not is_cloud and pool.cloud is not None:
            self.err((*ploc, "cloud"), f"pool {pool.name!r} has a cloud block but cluster {cluster.name!r} is "
                     "bare metal", "list 'hosts' instead, or move the pool to a gke/eks cluster")
            return None
        if pool.cloud is not None and cluster.kind == "eks" and pool.cloud.sharing == "gke-managed":
            self.err((*ploc, "cloud", "sharing"), "EKS has no GPU sharing of its own",
                     "set sharing: operator (the GPU Operator shares the GPUs)")
            return None
        if not self.dra_pool_ok(pool, ploc, cluster):
            return None

        defaults = self.env.defaults
        found: list[ResolvedNode | None] = []
        if pool.cloud is not None:
            assert pool.gpu_model is not None
            found.append(self.node(pool, cluster, _NodeSource(
                name=f"{pool.name}-node", address=None, count=pool.cloud.node_count, gpus=pool.cloud.gpus_per_node,
                gpu_model=pool.gpu_model, gpu_model_loc=(*ploc, "gpu_model"),
                driver=pool.cloud.driver_branch or defaults.driver_branch, profile=pool.profile,
                profile_loc=(*ploc, "profile"), nvswitch=False, containerd=defaults.containerd_version)))
        for hi, host in enumerate(pool.hosts):
            hloc = (*ploc, "hosts", hi)
            query = host.gpu_model or pool.gpu_model
            if query is None:
                self.err((*hloc, "gpu_model"), f"host {host.name!r} has no GPU model",
                         "set gpu_model on the host or on its pool")
                continue
            found.append(self.node(pool, cluster, _NodeSource(
                name=host.name, address=host.address, count=1, gpus=host.gpu_count, gpu_model=query,
                gpu_model_loc=(*hloc, "gpu_model") if host.gpu_model else (*ploc, "gpu_model"),
                driver=host.driver_branch or defaults.driver_branch, profile=host.profile or pool.profile,
                profile_loc=(*hloc, "profile") if host.profile else (*ploc, "profile"), nvswitch=host.nvswitch,
                containerd=host.containerd_version or defaults.containerd_version)))
        nodes = [node for node in found if node is not None]
        if not nodes:
            return None
        if pool.cloud is not None:  # what GKE or EKS would refuse at `pulumi up`, refused here at its line
            shape = CloudPool(pool.name, cluster.kind, pool.cloud, nodes[0].gpu_model,
                              self.profiles[nodes[0].profile][0], nodes[0].mig_layout)
            for refusal in cloud_refusals(shape):
                self.err((*ploc, *refusal.where), f"pool {pool.name!r}: {refusal.message}", refusal.fix)
        totals = Totals()
        for n in nodes:
            totals.add(n.gpus_per_node * n.count, n.hardware_units * n.count,
                       {k: v * n.count for k, v in n.advertised.items()})
        profile = self.profiles[pool.profile][0] if pool.profile in self.profiles else None
        sharing = profile.kind if profile else nodes[0].sharing
        isolations = {n.isolation for n in nodes}
        return ResolvedPool(
            name=pool.name, cluster=cluster.name, cluster_kind=cluster.kind, purpose=pool.purpose,
            profile=pool.profile, sharing=sharing,
            isolation=isolations.pop() if len(isolations) == 1 else "mixed",
            cloud=pool.cloud, nodes=nodes, totals=totals,
        )

    def node(self, pool: spec.Pool, cluster: spec.Cluster, source: _NodeSource) -> ResolvedNode | None:
        model = self.model(source.gpu_model, source.gpu_model_loc)
        entry = self.profiles.get(source.profile)
        if entry is None:
            self.err(source.profile_loc, f"unknown sharing profile {source.profile!r}",
                     f"use one of: {', '.join(sorted(self.profiles))}, or add profiles/{source.profile}.yaml")
            return None
        if model is None:
            return None
        profile = entry[0]
        kind = profile.kind
        layout, ok = self.layout_for(profile, model, source.driver, source.profile_loc)
        if not ok:
            return None

        gke_managed = pool.cloud is not None and cluster.kind == "gke" and pool.cloud.sharing == "gke-managed"
        on_dra = dra.is_dra(cluster)
        refusal = _node_refusal(profile, model, layout, cluster, on_dra, gke_managed)
        if refusal is not None:
            self.err(source.profile_loc, *refusal)
            return None

        per_gpu, units = advertised_per_gpu(profile, layout, cluster, gke_managed)
        managed_by: ManagedBy = "gke" if gke_managed else "gpu-operator" if pool.cloud is not None else "ansible"
        # Dynamic MIG: the DRA driver creates instances per claim, so mig-parted must leave the GPU alone.
        mig_config = self.mig_config(profile, model, layout) if model.mig_capable and (
            not on_dra or pool.mig_mode == "static") else None
        dp_config = None if gke_managed or on_dra else self.device_plugin_config(profile, cluster, layout)
        toolkit = self.env.defaults.toolkit_version
        labels = {**identity_labels(self.env.name, pool, profile.name, kind, model.slug),
                  **config_labels(managed_by, cluster.kind, dp_config, mig_config, toolkit)}

        taints = list(pool.taints)
        # Every node whose GPUs are shared without hardware isolation is tainted, so that only pods tolerating it
        # land there: trusted tenants' queued work (the pool's ResourceFlavor carries the toleration), never an
        # untrusted tenant's (admission refuses it the toleration), GPU pod or not.
        # An adopted cluster's running pods do not tolerate it yet: it waits for adoption.shared_gpu_taint.
        adoption = self.env.adoption
        if kind in spec.SHARED_KINDS and SHARED_GPU_TAINT not in taints \
                and (adoption is None or adoption.shared_gpu_taint):
            taints.append(SHARED_GPU_TAINT)

        return ResolvedNode(
            name=source.name, pool=pool.name, cluster=cluster.name, cluster_kind=cluster.kind, managed_by=managed_by,
            address=source.address, count=source.count, gpu_model=model, gpus_per_node=source.gpus,
            driver_branch=source.driver, profile=profile.name, sharing=kind, isolation=spec.ISOLATION[kind],
            mig_layout=layout, mig_config=mig_config, device_plugin_config=dp_config, labels=labels, taints=taints,
            advertised={k: v * source.gpus for k, v in per_gpu.items()}, hardware_units=units * source.gpus,
            nvswitch=source.nvswitch, containerd_version=source.containerd, toolkit_version=toolkit,
        )

    def dra_pool_ok(self, pool: spec.Pool, ploc: tuple[Any, ...], cluster: spec.Cluster) -> bool:
        """Pool settings a cluster's GPU allocation cannot carry out."""
        uses_mig = any(self.profiles.get(n, (None,))[0] is not None and self.profiles[n][0].kind in dra.MIG_KINDS
                       for n in {pool.profile, *(h.profile for h in pool.hosts if h.profile)})
        if pool.mig_mode == "dynamic" and not dra.is_dra(cluster):
            self.err((*ploc, "mig_mode"), f"pool {pool.name!r} asks for dynamic MIG, but cluster {cluster.name!r} "
                     "uses the device plugin, which serves only MIG instances made beforehand",
                     "set mig_mode: static (or remove it), or set the cluster's gpu_allocation: dra")
            return False
        if pool.mig_mode == "dynamic" and not uses_mig:
            self.err((*ploc, "mig_mode"), f"pool {pool.name!r} asks for dynamic MIG but its profile uses no MIG",
                     "remove mig_mode, or give the pool a MIG profile")
            return False
        if not dra.is_dra(cluster):
            return True
        if pool.cloud is not None and pool.cloud.sharing == "gke-managed":
            self.err((*ploc, "cloud", "sharing"), f"pool {pool.name!r} uses GKE's own device plugin, but cluster "
                     f"{cluster.name!r} allocates GPUs with DRA", "set sharing: operator, or move the pool to a "
                     "device-plugin cluster")
            return False
        if (cluster.dra_driver.install == "gpu-cluster" and pool.cloud is not None and uses_mig
                and pool.mig_mode == "static"):
            self.err((*ploc, "mig_mode"), f"pool {pool.name!r} needs the GPU Operator's mig-manager for static MIG, "
                     f"a ClusterPolicy operand, but cluster {cluster.name!r} installs the DRA driver through a "
                     "GPUCluster, which cannot exist beside a ClusterPolicy",
                     "set the cluster's dra.install: chart, or mig_mode: dynamic")
            return False
        return True

    def dra_cluster(self, cluster: spec.Cluster, ci: int, nodes: list[ResolvedNode]) -> None:
        """A DRA cluster's driver: a known version, gates it has and runs together, one consumable-shares count."""
        cloc: tuple[Any, ...] = ("clusters", ci)
        version = dra.driver_version(cluster)
        for message, fix in dra.version_problems(version):
            self.err((*cloc, "dra", "version"), f"cluster {cluster.name!r}: {message}", fix)
            return
        needed: dict[str, tuple[Any, ...]] = {}  # gate -> where the first profile that needs it is named
        for pi, name, profile in self.cluster_profiles(cluster):
            for gate in sorted(dra.profile_gates(profile.kind, self.env.pools[pi].mig_mode)):
                needed.setdefault(gate, ("pools", pi, "mig_mode") if gate == dra.DYNAMIC_MIG
                                  else self.profile_site(pi, name))
        self.dra_shares_agree(cluster)
        self.dra_kubernetes_gates(cluster, ci)
        extras = cluster.dra_driver.feature_gates
        dynamic_mig = dra.DYNAMIC_MIG in needed or dra.DYNAMIC_MIG in extras
        if dynamic_mig:
            self.dra_no_static_mig(cluster)
            overcommits = dra.counters_refusal(spec.version_tuple(cluster.kubernetes_version))
            if overcommits and any(p.kind in dra.TIME_SLICED for _, _, p in self.cluster_profiles(cluster)):
                self.err((*cloc, "kubernetes_version"), f"cluster {cluster.name!r}: {overcommits[0]}", overcommits[1])
        self.dra_shares_on_whole_devices(cluster, nodes, dynamic_mig)
        for gate, message, fix in dra.gate_problems(version, [*needed, *extras]):
            where = ((*cloc, "dra", "feature_gates", extras.index(gate)) if gate in extras
                     else needed.get(gate, (*cloc, "dra", "version")))
            self.err(where, f"cluster {cluster.name!r}: {message}", fix)
        for message, fix in dra.mapping_problems(dra.plans_for_nodes(nodes)):
            self.err((*cloc, "gpu_allocation"), f"cluster {cluster.name!r}: {message}", fix)
        alpha = dra.alpha_gates([*needed, *extras])
        if alpha:
            self.warnings.append(f"cluster {cluster.name}: DRA driver {version} runs alpha feature gates "
                                 f"{', '.join(alpha)}" + (" (ConsumableShares also needs Kubernetes' "
                                 "DRAConsumableCapacity feature on the cluster)" if "ConsumableShares" in alpha
                                 else ""))

    def dra_kubernetes_gates(self, cluster: spec.Cluster, ci: int) -> None:
        """Profiles whose DRA form rests on Kubernetes gates the cluster's operators have not said are on."""
        stated = set(cluster.dra_driver.kubernetes_feature_gates)
        minor = spec.version_tuple(cluster.kubernetes_version)
        missing: dict[str, str] = {}  # gate -> first profile that needs it
        for pi, name, profile in self.cluster_profiles(cluster):
            for gate in sorted(dra.kubernetes_gates_needed(profile.kind, self.env.pools[pi].mig_mode, minor) - stated):
                missing.setdefault(gate, name)
        for gate, name in missing.items():
            what = ("time-slicing across pods (consumable shares)" if gate == "DRAConsumableCapacity"
                    else "dynamic MIG (devices that share a GPU's counters)")
            self.err(("clusters", ci, "dra", "kubernetes_feature_gates"),
                     f"cluster {cluster.name!r}: profile {name!r} needs Kubernetes' {gate} feature gate for {what}; "
                     "without it the API server drops those fields and each claim takes a whole device",
                     f"turn {gate} on in the cluster's API server, scheduler and kubelets and add it to the cluster's "
                     "dra.kubernetes_feature_gates, or put the pool on a device-plugin cluster")

    def cluster_profiles(self, cluster: spec.Cluster) -> list[tuple[int, str, spec.SharingProfile]]:
        """(pool index, profile name, profile) for every profile the cluster's pools and hosts name, in file order."""
        out = []
        for pi, p in enumerate(self.env.pools):
            if p.cluster != cluster.name:
                continue
            for name in dict.fromkeys([p.profile, *(h.profile for h in p.hosts if h.profile)]):
                profile = self.profiles.get(name, (None,))[0]
                if profile is not None:
                    out.append((pi, name, profile))
        return out

    def dra_shares_on_whole_devices(self, cluster: spec.Cluster, nodes: list[ResolvedNode], dynamic_mig: bool) -> None:
        """Time-sliced profiles on devices the driver publishes with capacities a claim consumes whole."""
        seen: set[tuple[str, str]] = set()
        for node in nodes:
            refusal = dra.shares_refusal(node.gpu_model, node.sharing, dynamic_mig)
            if refusal is None or (node.pool, node.profile) in seen:
                continue
            seen.add((node.pool, node.profile))
            pi = next(i for i, p in enumerate(self.env.pools) if p.name == node.pool and p.cluster == cluster.name)
            message, fix = refusal
            self.err(self.profile_site(pi, node.profile), f"pool {node.pool!r}, profile {node.profile!r} in DRA "
                     f"cluster {cluster.name!r}: {message}", fix)

    def dra_no_static_mig(self, cluster: spec.Cluster) -> None:
        """With DynamicMIG the driver destroys, on every node of the cluster, MIG devices it did not create."""
        for pi, _, profile in self.cluster_profiles(cluster):
            pool = self.env.pools[pi]
            if profile.kind in dra.MIG_KINDS and pool.mig_mode == "static":
                self.err(("pools", pi, "mig_mode"), f"pool {pool.name!r} keeps a static MIG layout, but DRA cluster "
                         f"{cluster.name!r} runs the driver's DynamicMIG gate, which destroys at start every MIG "
                         "instance it did not create", "set mig_mode: dynamic on every MIG pool of this cluster, "
                         "or move the dynamic pools (and DynamicMIG) to another DRA cluster")

    def dra_shares_agree(self, cluster: spec.Cluster) -> None:
        """The driver publishes one consumable-shares count per cluster: its time-slicing profiles must agree."""
        first: tuple[int, str] | None = None
        for pi, name, profile in self.cluster_profiles(cluster):
            if not isinstance(profile, (spec.TimeSlicingProfile, spec.MigTimeSlicingProfile)):  # dra.TIME_SLICED
                continue
            count = profile.time_slicing.replicas
            if first is None:
                first = (count, name)
            elif count != first[0]:
                self.err(self.profile_site(pi, name), f"profile {name!r} time-slices {count} ways but {first[1]!r} "
                         f"on the same DRA cluster {cluster.name!r} {first[0]} ways: the driver publishes one "
                         "consumable-shares count per cluster", "give the time-slicing profiles on this cluster "
                         "the same replicas, or split them across clusters")

    def profile_site(self, pi: int, name: str) -> tuple[Any, ...]:
        """Where a pool (or the first of its hosts) names a profile."""
        pool = self.env.pools[pi]
        if pool.profile == name:
            return ("pools", pi, "profile")
        hi = next(i for i, h in enumerate(pool.hosts) if h.profile == name)
        return ("pools", pi, "hosts", hi, "profile")

    def tenants(self, clusters: dict[str, spec.Cluster], pools: list[ResolvedPool]) -> list[ResolvedTenant]:
        advertised_by_cluster: dict[str, set[str]] = {c: set() for c in clusters}
        for p in pools:
            advertised_by_cluster[p.cluster].update(p.totals.advertised)
        out: list[ResolvedTenant] = []
        names: set[str] = set()
        namespaces: set[str] = set()
        for ti, t in enumerate(self.env.tenants):
            tloc: tuple[Any, ...] = ("tenants", ti)
            if t.name in names:
                self.err((*tloc, "name"), f"tenant {t.name!r} is defined twice", "rename one")
            if t.namespace in namespaces:
                self.err((*tloc, "namespace"), f"namespace {t.namespace!r} belongs to two tenants",
                         "give each tenant its own namespace")
            names.add(t.name)
            namespaces.add(t.namespace)
            used = t.clusters if t.clusters is not None else list(clusters)
            for ci, c in enumerate(used):
                if c not in clusters:
                    self.err((*tloc, "clusters", ci), f"tenant {t.name!r} names unknown cluster {c!r}",
                             f"use one of: {', '.join(clusters)}")
            available = set().union(*(advertised_by_cluster.get(c, set()) for c in used)) if used else set()
            complete = not self.incomplete_clusters & set(used)
            for resource in t.quota:
                if complete and resource not in available:
                    self.err((*tloc, "quota", resource),
                             f"tenant {t.name!r} has a quota on {resource}, which no pool in "
                             f"{', '.join(used)} advertises",
                             f"use an advertised resource: {', '.join(sorted(available)) or '(none)'}")
            for resource in t.borrowing_limit:
                if resource not in t.quota:
                    self.err((*tloc, "borrowing_limit", resource),
                             f"tenant {t.name!r} may borrow {resource} but has no quota on it",
                             "add the resource to quota (0 is allowed) or remove the borrowing limit")
            out.append(ResolvedTenant(name=t.name, namespace=t.namespace, trust=t.trust, priority=t.priority,
                                      clusters=used, quota=dict(t.quota), borrowing_limit=dict(t.borrowing_limit),
                                      pod_security=t.pod_security_level, quota_name=t.quota_name))
        return out


def _node_refusal(profile: spec.SharingProfile, model: GpuModel, layout: dict[str, int] | None,
                 cluster: spec.Cluster, on_dra: bool, gke_managed: bool) -> tuple[str, str] | None:
    """(message, fix) where the cluster cannot serve the profile on this GPU model; None where it can."""
    if on_dra:
        refusals = dra.profile_refusals(profile.kind, dra.driver_version(cluster))
        if refusals:  # the first: the others follow from it
            message, fix = refusals[0]
            return f"profile {profile.name!r} in DRA cluster {cluster.name!r}: {message}", fix
    elif profile.kind == "mps" and cluster.mig_strategy == "mixed" and not gke_managed:
        return (f"MPS profile {profile.name!r} in cluster {cluster.name!r}, whose mig_strategy is mixed: the "
                "device plugin refuses MPS with the mixed strategy",
                "set the cluster's mig_strategy to single, or use time-slicing here")
    if layout is not None and len(layout) > 1 and not on_dra and (cluster.mig_strategy == "single" or gke_managed):
        why = ("GKE's own sharing takes one partition size per pool" if gke_managed else
               f"cluster {cluster.name!r} uses mig_strategy single, which needs one profile per node")
        return (f"profile {profile.name!r} gives {model.name} several MIG profiles ({', '.join(layout)}) but "
                f"{why}", "use a single-profile layout (e.g. all-smallest), or sharing: operator with "
                "mig_strategy mixed")
    return None


def device_plugin_digest(content: dict[str, Any]) -> str:
    """The content hash that ends a device-plugin config's name: a changed config is a new name."""
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:8]


# Operands that Ansible provides itself on the hosts it manages: driver, toolkit, MIG (mig-parted's systemd unit)
# and the DCGM host engine (read by a separate hostNetwork exporter).
HOST_STACK_OPT_OUTS = ("driver", "container-toolkit", "mig-manager", "dcgm-exporter")


def host_opt_outs(nodes: Iterable[ResolvedNode]) -> dict[str, dict[str, str]]:
    """GPU Operator opt-out labels (set by Pulumi) per Ansible-managed host of one cluster. Needed only where the
    cluster also has operator-managed nodes: an all-Ansible cluster turns those operands off in the operator's
    values instead, and the operator's mig-manager would otherwise apply all-disabled to the hosts."""
    members = list(nodes)
    if not any(n.managed_by == "gpu-operator" for n in members):
        return {}
    return {n.name: {f"nvidia.com/gpu.deploy.{operand}": "false" for operand in HOST_STACK_OPT_OUTS}
            for n in members if n.managed_by == "ansible"}


def generic_layout(model: GpuModel, form: str) -> dict[str, int]:
    """Model-agnostic layouts, resolved per GPU model from its plain (no +me/-me/+gfx) profiles."""
    plain = [p for p in model.profiles.values() if "+" not in p.name and "-" not in p.name]
    if form == "whole":
        full = max(plain, key=lambda p: (p.compute_slices, p.memory_slices))
        return {full.name: 1}
    ones = sorted((p for p in plain if p.compute_slices == 1), key=lambda p: p.memory_slices)
    smallest = ones[0]
    if form == "all-smallest":
        count = min(smallest.max_count, model.placement_units_total // smallest.memory_slices,
                    model.compute_slices_total)
        return {smallest.name: count}
    # balanced: one 3g and one 2g where the model has them, the rest in the smallest 1g (NVIDIA's all-balanced)
    layout: dict[str, int] = {}
    compute, memory = model.compute_slices_total, model.placement_units_total
    for slices in (3, 2):
        candidates = sorted((p for p in plain if p.compute_slices == slices), key=lambda p: p.memory_slices)
        if candidates and candidates[0].compute_slices < compute:
            layout[candidates[0].name] = 1
            compute -= candidates[0].compute_slices
            memory -= candidates[0].memory_slices
    fill = min(compute, memory // smallest.memory_slices, smallest.max_count)
    if fill:
        layout[smallest.name] = fill
    return layout


def advertised_per_gpu(profile: spec.SharingProfile, layout: dict[str, int] | None, cluster: spec.Cluster,
                       gke_managed: bool) -> tuple[dict[str, int], int]:
    """Resource names and counts one GPU advertises, exactly as the device plugin names them, and its hardware
    units (a whole GPU or one MIG instance is one unit)."""
    if layout is None:
        units = 1
        if profile.kind == "exclusive":
            return {"nvidia.com/gpu": 1}, units
        assert isinstance(profile, (spec.TimeSlicingProfile, spec.MpsProfile)), profile.kind  # MIG has a layout
        block = profile.time_slicing if profile.kind == "time-slicing" else profile.mps
        shared = block.rename_by_default and not gke_managed
        return {"nvidia.com/gpu.shared" if shared else "nvidia.com/gpu": block.replicas}, units
    units = sum(layout.values())
    ts = profile.time_slicing if profile.kind == "mig-time-slicing" else None
    replicas = ts.replicas if ts is not None else 1
    suffix = ".shared" if ts is not None and ts.rename_by_default and not gke_managed else ""
    out: dict[str, int] = {}
    for name, count in layout.items():
        if cluster.mig_strategy == "single" or gke_managed:
            resource = f"nvidia.com/gpu{suffix}"
        else:
            resource = f"nvidia.com/mig-{name.replace('+', '.')}{suffix}"
        out[resource] = out.get(resource, 0) + count * replicas
    return out, units


def device_plugin_content(profile: spec.SharingProfile, cluster: spec.Cluster, layout: dict[str, int] | None
                          ) -> dict[str, Any]:
    """The k8s-device-plugin config file (version v1). The GPU Operator overrides migStrategy and the device list
    strategy through env vars; we write the same values it will set so the file never disagrees with them."""
    strategy = ["cdi-annotations", "cdi-cri"] if cluster.cdi else ["volume-mounts"]
    content: dict[str, Any] = {
        "version": "v1",
        "flags": {
            "migStrategy": cluster.mig_strategy,
            "failOnInitError": True,
            "plugin": {"deviceListStrategy": strategy, "deviceIDStrategy": "uuid"},
        },
    }
    if profile.kind in ("time-slicing", "mig-time-slicing"):
        ts = profile.time_slicing
        if layout is not None and cluster.mig_strategy == "mixed":
            names = [f"nvidia.com/mig-{p.replace('+', '.')}" for p in layout]
        else:
            names = ["nvidia.com/gpu"]
        content["sharing"] = {"timeSlicing": {
            "renameByDefault": ts.rename_by_default,
            "failRequestsGreaterThanOne": ts.fail_requests_greater_than_one,
            "resources": [{"name": n, "replicas": ts.replicas} for n in names],
        }}
    elif profile.kind == "mps":
        content["sharing"] = {"mps": {
            "renameByDefault": profile.mps.rename_by_default,
            "resources": [{"name": "nvidia.com/gpu", "replicas": profile.mps.replicas}],
        }}
    return content


def load_profiles(directory: Path, env: spec.Environment, doc: Located
                  ) -> dict[str, tuple[spec.SharingProfile, Located]]:
    found: dict[str, tuple[spec.SharingProfile, Located]] = {}
    problems: list[Problem] = []
    exit_code = 1
    for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
        try:
            profile, pdoc = spec.load_profile_file(path)
        except GpushareError as exc:
            problems.extend(exc.problems)
            exit_code = max(exit_code, exc.exit_code)  # a file that cannot be read at all stays unusable input
            continue
        found[profile.name] = (profile, pdoc)
    for i, profile in enumerate(env.profiles):
        if profile.name in found:
            problems.append(doc.problem(("profiles", i, "name"),
                                        f"profile {profile.name!r} is also defined in {found[profile.name][1].file}",
                                        "rename the environment's own profile"))
        found[profile.name] = (profile, doc.at("profiles", i))
    if problems:
        raise GpushareError(problems, exit_code=exit_code)
    _check_profile_models(found)
    return found


def _check_profile_models(profiles: dict[str, tuple[spec.SharingProfile, Located]]) -> None:
    """Keys of explicit per-model layouts must be GPU models the catalog knows."""
    catalog = load_catalog()
    problems = []
    for profile, pdoc in profiles.values():
        layouts = getattr(getattr(profile, "mig", None), "layouts", None) or {}
        for key in layouts:
            try:
                catalog.lookup(key)
            except GpushareError as exc:
                problems.append(pdoc.problem(("mig", "layouts", key), exc.problems[0].message,
                                             "key layouts by NVML product name, alias or PCI id"))
    if problems:
        raise GpushareError(problems)


def resolve(env_file: Path, profiles_dir: Path | None = None) -> ResolvedFleet:
    env, doc = spec.load_environment(env_file)
    profiles = load_profiles(profiles_dir or default_profiles_dir(env_file), env, doc)
    resolver = _Resolver(env, doc, profiles)
    stem = environment_stem(env_file)
    if env.name != stem:
        # Guardrail limits follow the environment the CLI or the stack names (the file), never `name:` alone.
        resolver.err(("name",), f"environment name {env.name!r} differs from its file name {env_file.name!r}",
                     f"rename the file to {env.name}.yaml or set name: {stem}")
    return resolver.run(env_file)


def environment_stem(env_file: Path) -> str:
    """The environment a file is, by its name: `environments/prod.yaml` is prod, whatever it says inside."""
    return env_file.name.removesuffix(".yaml").removesuffix(".yml")


def resolve_env(env: str, profiles_dir: Path | None = None) -> ResolvedFleet:
    return resolve(environment_path(env), profiles_dir)

