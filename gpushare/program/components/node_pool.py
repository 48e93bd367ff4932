"""GpuNodePool: one pool of the resolved fleet made true on its cluster. Bare metal: a NodePatch per host with exactly
the labels Pulumi owns and the pool's taints. GKE: a node pool with guest accelerators, sharing either compiled to
GKE's own config or left to the GPU Operator. EKS: a managed node group on the NVIDIA AMI, shared by the operator."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi_kubernetes.core.v1 import NodePatch

from gpushare.core import spec
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.resolve import ResolvedNode, ResolvedPool
from gpushare.program.stack_config import EksSettings, GkeSettings

# Kubernetes taint effects as GKE node pools and EKS node groups spell them.
CLOUD_TAINT_EFFECT = {"NoSchedule": "NO_SCHEDULE", "PreferNoSchedule": "PREFER_NO_SCHEDULE",
                      "NoExecute": "NO_EXECUTE"}
# EKS's NVIDIA-accelerated AL2023 AMI: driver and container toolkit come with the image.
EKS_AMI_TYPE = "AL2023_x86_64_NVIDIA"
# GKE's limit on max_shared_clients_per_gpu, for time-sharing and MPS alike.
GKE_MAX_SHARED_CLIENTS = 48
CLOUD_PACKAGE = {"gke": "pulumi-gcp", "eks": "pulumi-aws"}
GKE_SHARING_STRATEGY = {"time-slicing": "TIME_SHARING", "mig-time-slicing": "TIME_SHARING", "mps": "MPS"}


@dataclass
class GpuNodePoolArgs:
    pool: ResolvedPool
    cluster: spec.Cluster
    profiles: dict[str, Any]  # the fleet's sharing profiles by name
    provider: pulumi.ProviderResource | None = None  # the cluster's Kubernetes provider (bare metal)
    opt_outs: dict[str, dict[str, str]] = field(default_factory=dict)  # host -> GPU Operator opt-out labels
    gke: GkeSettings | None = None
    eks: EksSettings | None = None
    after: list[pulumi.Resource] = field(default_factory=list)  # cloud pools wait for the cluster's NVIDIA stack
    source: str | None = None  # the environment file and the pool's index there, for error messages
    index: int | None = None


def _problem(pool: ResolvedPool, message: str, fix: str) -> GpushareError:
    return GpushareError(Problem(f"pool {pool.name!r}: {message}", fix=fix))


def gke_sharing(pool: ResolvedPool, node: ResolvedNode, profiles: dict[str, Any]) -> dict[str, Any]:
    """The guest-accelerator fields a GKE-managed pool compiles its profile to; a profile GKE cannot express is an
    error here, before anything is registered."""
    profile = profiles[node.profile]
    out: dict[str, Any] = {}
    if node.mig_layout:
        (partition, count), = node.mig_layout.items()  # the resolver allows one partition size per GKE pool
        mig = node.gpu_model.profiles[partition]
        if "+" in partition or "-" in partition:
            raise _problem(pool, f"MIG profile {partition} has no GKE partition size",
                           "use a plain profile (for example 1g.10gb), or sharing: operator")
        if count != mig.max_count:
            raise _problem(pool, f"profile {node.profile!r} asks for {count} x {partition} per GPU, but GKE's "
                           f"gpu_partition_size always creates {mig.max_count} on {node.gpu_model.name}",
                           f"use {partition}={mig.max_count} (layout all-smallest for the smallest size), or "
                           "sharing: operator")
        out["gpu_partition_size"] = partition
    strategy = GKE_SHARING_STRATEGY.get(node.sharing)
    if strategy:
        replicas = (profile.mps if node.sharing == "mps" else profile.time_slicing).replicas
        if replicas > GKE_MAX_SHARED_CLIENTS:
            raise _problem(pool, f"{replicas} clients per GPU is above GKE's limit of {GKE_MAX_SHARED_CLIENTS}",
                           f"use at most {GKE_MAX_SHARED_CLIENTS} replicas, or sharing: operator")
        out["gpu_sharing_config"] = {"gpu_sharing_strategy": strategy, "max_shared_clients_per_gpu": replicas}
    return out


def per_zone(pool: ResolvedPool, count: int, zones: int, what: str) -> int:
    if count % zones:
        raise _problem(pool, f"{what} {count} cannot be spread evenly over {zones} zones (GKE counts nodes per "
                       "zone)", f"use a multiple of {zones}, or change the zones")
    return count // zones


def bare_metal_patches(args: GpuNodePoolArgs) -> dict[str, dict[str, Any]]:
    """NodePatch inputs per host: exactly the labels Pulumi owns (plus the cluster's opt-outs) and the pool taints."""
    out = {}
    for node in args.pool.nodes:
        opt_outs = args.opt_outs.get(node.name, {})
        metadata: dict[str, Any] = {"name": node.name, "labels": {**node.labels_owned_by("pulumi"), **opt_outs}}
        inputs: dict[str, Any] = {"metadata": metadata}
        if node.taints:
            # Node taints are an atomic list under server-side apply: with no pool taints we claim nothing.
            inputs["spec"] = {"taints": [t.model_dump() for t in node.taints]}
        if node.taints or opt_outs:
            # Other managers may own these fields (the node controller rewrites the taint list; the operator labels
            # gpu.deploy.*=true where a label is missing): the fleet's values win.
            metadata["annotations"] = {"pulumi.com/patchForce": "true"}
        out[node.name] = inputs
    return out


def gke_node_pool_inputs(args: GpuNodePoolArgs) -> dict[str, Any]:
    pool, cloud, gke = args.pool, args.pool.cloud, args.gke
    assert cloud is not None and gke is not None
    (node,) = pool.nodes
    accelerator_type = node.gpu_model.gke_accelerator
    if not accelerator_type:
        raise _problem(pool, f"GKE offers no accelerator type for {node.gpu_model.name}",
                       "use a GPU model GKE offers (the catalog's gke_accelerator)")
    accelerator: dict[str, Any] = {"type": accelerator_type, "count": node.gpus_per_node}
    if node.managed_by == "gke":
        accelerator.update(gke_sharing(pool, node, args.profiles))
        accelerator["gpu_driver_installation_config"] = {"gpu_driver_version": gke.driver_version}
    else:
        # The GPU Operator serves this pool: GKE installs no driver and runs no device plugin here (the
        # gke-no-default-nvidia-gpu-device-plugin label is among the pool's labels).
        accelerator["gpu_driver_installation_config"] = {"gpu_driver_version": "INSTALLATION_DISABLED"}
    zones = cloud.zones or ([gke.location] if re.search(r"-[a-z]$", gke.location) else [])
    if not zones:
        raise _problem(pool, f"GKE location {gke.location} is a region and the pool lists no zones",
                       "list the pool's zones under cloud.zones (GKE counts nodes per zone)")
    node_config: dict[str, Any] = {
        "machine_type": cloud.machine_type,
        "guest_accelerators": [accelerator],
        "labels": node.labels_owned_by("pulumi"),
        "taints": [{"key": t.key, "value": t.value, "effect": CLOUD_TAINT_EFFECT[t.effect]} for t in node.taints],
    }
    if gke.service_account:
        node_config["service_account"] = gke.service_account
    inputs: dict[str, Any] = {
        "project": gke.project,
        "location": gke.location,
        "cluster": gke.cluster,
        "name_prefix": f"{pool.name[:30]}-",
        "node_config": node_config,
    }
    if cloud.zones:
        inputs["node_locations"] = list(cloud.zones)
    if cloud.min_node_count is not None or cloud.max_node_count is not None:
        inputs["initial_node_count"] = per_zone(pool, cloud.node_count, len(zones), "node_count")
        inputs["autoscaling"] = {
            "total_min_node_count": cloud.min_node_count if cloud.min_node_count is not None else cloud.node_count,
            "total_max_node_count": cloud.max_node_count if cloud.max_node_count is not None else cloud.node_count,
            "location_policy": "BALANCED",
        }
    else:
        inputs["node_count"] = per_zone(pool, cloud.node_count, len(zones), "node_count")
    return inputs


def eks_node_group_inputs(args: GpuNodePoolArgs) -> dict[str, Any]:
    pool, cloud, eks = args.pool, args.pool.cloud, args.eks
    assert cloud is not None and eks is not None
    (node,) = pool.nodes
    low = cloud.min_node_count if cloud.min_node_count is not None else cloud.node_count
    high = cloud.max_node_count if cloud.max_node_count is not None else cloud.node_count
    if high < 1:
        raise _problem(pool, "an EKS node group needs a maximum size of at least 1",
                       "set cloud.max_node_count (or node_count) to 1 or more")
    if not low <= cloud.node_count <= high:
        raise _problem(pool, f"node_count {cloud.node_count} is outside {low}..{high}",
                       "keep node_count between min_node_count and max_node_count")
    return {
        "cluster_name": eks.cluster,
        "node_role_arn": eks.node_role_arn,
        "subnet_ids": list(eks.subnet_ids),
        "ami_type": EKS_AMI_TYPE,
        "instance_types": [cloud.machine_type],
        "scaling_config": {"desired_size": cloud.node_count, "min_size": low, "max_size": high},
        "labels": node.labels_owned_by("pulumi"),
        "taints": [{"key": t.key, **({"value": t.value} if t.value else {}), "effect": CLOUD_TAINT_EFFECT[t.effect]}
                   for t in node.taints],
        "tags": {"gpushare.io/pool": pool.name},
    }


def node_pool_inputs(args: GpuNodePoolArgs) -> dict[str, Any]:
    """Everything the pool will register, computed and checked without registering anything."""
    try:
        return _node_pool_inputs(args)
    except GpushareError as err:
        where = f"pools[{args.index}]" if args.index is not None else None
        raise GpushareError([dataclasses.replace(p, file=p.file or args.source, path=p.path or where)
                             for p in err.problems]) from None


def _node_pool_inputs(args: GpuNodePoolArgs) -> dict[str, Any]:
    kind = args.cluster.kind
    if kind == "bare-metal":
        return bare_metal_patches(args)
    package = CLOUD_PACKAGE[kind]
    if importlib.util.find_spec(package.replace("-", "_")) is None:
        raise _problem(args.pool, f"{kind.upper()} pools need the {package} package",
                       "install gpushare with its cloud extra: pip install -e '.[cloud]'")
    if kind == "gke":
        if args.gke is None:
            raise _problem(args.pool, "GKE pools need the cluster's stack settings", "set gpushare:clusters")
        return gke_node_pool_inputs(args)
    if args.eks is None:
        raise _problem(args.pool, "EKS pools need the cluster's stack settings", "set gpushare:clusters")
    return eks_node_group_inputs(args)


class GpuNodePool(pulumi.ComponentResource):
    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpushare:pools:GpuNodePool", name, None, opts)
        inputs = node_pool_inputs(args)
        kind = args.cluster.kind
        if kind == "bare-metal":
            if args.provider is None:
                raise GpushareError(f"pool {args.pool.name!r}: bare-metal pools need the cluster's Kubernetes provider")
            opts_k8s = pulumi.ResourceOptions(parent=self, provider=args.provider)
            for host, patch in inputs.items():
                NodePatch(f"{name}-{host}", **patch, opts=opts_k8s)
        elif kind == "gke":
            import pulumi_gcp as gcp

            gcp.container.NodePool(f"{name}-node-pool", **inputs,
                                   opts=pulumi.ResourceOptions(parent=self, depends_on=args.after))
        else:
            import pulumi_aws as aws

            scaling = inputs["scaling_config"]
            # The cluster autoscaler moves the desired size; Pulumi keeps only the bounds.
            ignore = ["scalingConfig.desiredSize"] if scaling["min_size"] != scaling["max_size"] else []
            aws.eks.NodeGroup(f"{name}-node-group", **inputs, opts=pulumi.ResourceOptions(
                parent=self, depends_on=args.after, ignore_changes=ignore))
            pulumi.log.warn(
                f"pool {args.pool.name}: the EKS NVIDIA AMI configures its own container toolkit, so gpushare does not "
                "enforce accept-nvidia-visible-devices-envvar-when-unprivileged=false there: keep untrusted tenants "
                "off this pool")
        self.register_outputs({"pool": args.pool.name, **args.pool.totals.as_dict()})
