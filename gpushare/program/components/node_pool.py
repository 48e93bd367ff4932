"""GpuNodePool: one pool of the resolved fleet made true on its cluster. Bare metal: a NodePatch per host with exactly
the labels Pulumi owns and the pool's taints. GKE: a node pool with guest accelerators, sharing either compiled to
GKE's own config or left to the GPU Operator. EKS: a managed node group on the NVIDIA AMI, shared by the operator."""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi_kubernetes.core.v1 import NodePatch

from gpushare.core import spec
from gpushare.core.cloud_pools import CloudPool, eks_scaling, gke_accelerator, gke_sharing, gke_zones, per_zone
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.resolve import ResolvedPool
from gpushare.program.stack_config import EksSettings, GkeSettings

# Kubernetes taint effects as GKE node pools and EKS node groups spell them.
CLOUD_TAINT_EFFECT = {"NoSchedule": "NO_SCHEDULE", "PreferNoSchedule": "PREFER_NO_SCHEDULE",
                      "NoExecute": "NO_EXECUTE"}
# EKS's NVIDIA-accelerated AL2023 AMI: driver and container toolkit come with the image.
EKS_AMI_TYPE = "AL2023_x86_64_NVIDIA"
CLOUD_PACKAGE = {"gke": "pulumi-gcp", "eks": "pulumi-aws"}


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


def cloud_pool(args: GpuNodePoolArgs) -> CloudPool:
    """The pool as the library's cloud rules read it (a cloud pool has one node shape)."""
    assert args.pool.cloud is not None
    (node,) = args.pool.nodes
    return CloudPool(args.pool.name, args.cluster.kind, args.pool.cloud, node.gpu_model, args.profiles[node.profile],
                     node.mig_layout)


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
    shape = cloud_pool(args)
    accelerator: dict[str, Any] = {"type": gke_accelerator(shape), "count": node.gpus_per_node}
    if node.managed_by == "gke":
        accelerator.update(gke_sharing(shape))
        accelerator["gpu_driver_installation_config"] = {"gpu_driver_version": gke.driver_version}
    else:
        # The GPU Operator serves this pool: GKE installs no driver and runs no device plugin here (the
        # gke-no-default-nvidia-gpu-device-plugin label is among the pool's labels).
        accelerator["gpu_driver_installation_config"] = {"gpu_driver_version": "INSTALLATION_DISABLED"}
    zones = gke_zones(shape, gke.location)
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
        inputs["initial_node_count"] = per_zone(shape, len(zones))
        inputs["autoscaling"] = {
            "total_min_node_count": cloud.min_node_count if cloud.min_node_count is not None else cloud.node_count,
            "total_max_node_count": cloud.max_node_count if cloud.max_node_count is not None else cloud.node_count,
            "location_policy": "BALANCED",
        }
    else:
        inputs["node_count"] = per_zone(shape, len(zones))
    return inputs


def eks_node_group_inputs(args: GpuNodePoolArgs) -> dict[str, Any]:
    pool, eks = args.pool, args.eks
    assert pool.cloud is not None and eks is not None
    (node,) = pool.nodes
    scaling = eks_scaling(cloud_pool(args))
    return {
        "cluster_name": eks.cluster,
        "node_role_arn": eks.node_role_arn,
        "subnet_ids": list(eks.subnet_ids),
        "ami_type": EKS_AMI_TYPE,
        "instance_types": [pool.cloud.machine_type],
        "scaling_config": scaling,
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
        raise GpushareError([dataclasses.replace(p, file=p.file or args.source, path=_under_pool(args, p.path))
                             for p in err.problems]) from None


def _under_pool(args: GpuNodePoolArgs, path: str | None) -> str | None:
    """A path under the pool (the library's cloud rules give one) placed under pools[i] of the environment."""
    if args.index is None:
        return path
    return f"pools[{args.index}].{path}" if path else f"pools[{args.index}]"


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
