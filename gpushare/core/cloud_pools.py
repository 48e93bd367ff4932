"""What GKE and EKS accept for a node pool, as rules over the pool's settings, its GPU model and its sharing profile.
Resolution refuses a pool these rules refuse (with the file and line of the setting that decides it), and the Pulumi
program compiles its node pools with the same functions, so `gpushare validate` refuses what `pulumi up` would."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpushare.core import spec
from gpushare.core.catalog import GpuModel
from gpushare.core.errors import GpushareError, Problem

# GKE's limit on max_shared_clients_per_gpu, for time-sharing and MPS alike.
GKE_MAX_SHARED_CLIENTS = 48
GKE_SHARING_STRATEGY = {"time-slicing": "TIME_SHARING", "mig-time-slicing": "TIME_SHARING", "mps": "MPS"}


@dataclass(frozen=True)
class Refusal:
    """Why the cloud would refuse a pool: the pool setting that decides it, what is wrong, and the fix."""

    where: tuple[str, ...]  # a path under the pool, e.g. ("cloud", "node_count")
    message: str
    fix: str


class PoolRefused(GpushareError):
    """A cloud pool the cloud would refuse; `refusal.where` locates it under the pool."""

    def __init__(self, pool: str, refusal: Refusal) -> None:
        super().__init__(Problem(f"pool {pool!r}: {refusal.message}", path=".".join(refusal.where), fix=refusal.fix))
        self.refusal = refusal


@dataclass(frozen=True)
class CloudPool:
    """What the rules read about one cloud pool (its single node shape)."""

    name: str
    kind: str  # the cluster's: gke or eks
    cloud: spec.CloudNodes
    model: GpuModel
    profile: Any  # the sharing profile (spec profile model)
    layout: dict[str, int] | None  # MIG instances per GPU

    @property
    def gke_managed(self) -> bool:
        return self.kind == "gke" and self.cloud.sharing == "gke-managed"

    def refuse(self, where: tuple[str, ...], message: str, fix: str) -> PoolRefused:
        return PoolRefused(self.name, Refusal(where, message, fix))


def gke_accelerator(pool: CloudPool) -> str:
    """GKE's accelerator type for the pool's GPU model."""
    if not pool.model.gke_accelerator:
        raise pool.refuse(("gpu_model",), f"GKE offers no accelerator type for {pool.model.name}",
                          "use a GPU model GKE offers (the catalog's gke_accelerator)")
    return pool.model.gke_accelerator


def gke_partition_size(pool: CloudPool) -> str | None:
    """gpu_partition_size: GKE creates as many instances of its one size as fit, so the layout must be exactly that."""
    if not pool.layout:
        return None
    (partition, count), = pool.layout.items()  # resolution allows one partition size per GKE-managed pool
    mig = pool.model.profiles[partition]
    if "+" in partition or "-" in partition:
        raise pool.refuse(("profile",), f"MIG profile {partition} has no GKE partition size",
                          "use a plain profile (for example 1g.10gb), or sharing: operator")
    if count != mig.max_count:
        raise pool.refuse(("profile",), f"profile {pool.profile.name!r} asks for {count} x {partition} per GPU, but "
                          f"GKE's gpu_partition_size always creates {mig.max_count} on {pool.model.name}",
                          f"use {partition}={mig.max_count} (layout all-smallest for the smallest size), or "
                          "sharing: operator")
    return partition


def gke_sharing_config(pool: CloudPool) -> dict[str, Any] | None:
    """gpu_sharing_config: time-sharing or MPS with the profile's replicas, within GKE's client limit."""
    strategy = GKE_SHARING_STRATEGY.get(pool.profile.kind)
    if strategy is None:
        return None
    replicas = (pool.profile.mps if pool.profile.kind == "mps" else pool.profile.time_slicing).replicas
    if replicas > GKE_MAX_SHARED_CLIENTS:
        raise pool.refuse(("profile",), f"{replicas} clients per GPU is above GKE's limit of {GKE_MAX_SHARED_CLIENTS}",
                          f"use at most {GKE_MAX_SHARED_CLIENTS} replicas, or sharing: operator")
    return {"gpu_sharing_strategy": strategy, "max_shared_clients_per_gpu": replicas}


def gke_sharing(pool: CloudPool) -> dict[str, Any]:
    """The guest-accelerator fields a GKE-managed pool compiles its profile to."""
    out: dict[str, Any] = {}
    partition = gke_partition_size(pool)
    if partition:
        out["gpu_partition_size"] = partition
    config = gke_sharing_config(pool)
    if config:
        out["gpu_sharing_config"] = config
    return out


def gke_zones(pool: CloudPool, location: str) -> list[str]:
    """The zones GKE counts nodes in: the pool's, or the cluster's location where that is a zone."""
    zones = list(pool.cloud.zones) or ([location] if re.search(r"-[a-z]$", location) else [])
    if not zones:
        raise pool.refuse(("cloud", "zones"), f"GKE location {location} is a region and the pool lists no zones",
                          "list the pool's zones under cloud.zones (GKE counts nodes per zone)")
    return zones


def per_zone(pool: CloudPool, zones: int) -> int:
    """GKE counts nodes per zone; the environment's node_count is the pool's total."""
    count = pool.cloud.node_count
    if count % zones:
        raise pool.refuse(("cloud", "node_count"), f"node_count {count} cannot be spread evenly over {zones} zones "
                          "(GKE counts nodes per zone)", f"use a multiple of {zones}, or change the zones")
    return count // zones


def eks_scaling(pool: CloudPool) -> dict[str, int]:
    """An EKS node group's scaling_config, its bounds defaulting to node_count."""
    cloud = pool.cloud
    low = cloud.min_node_count if cloud.min_node_count is not None else cloud.node_count
    high = cloud.max_node_count if cloud.max_node_count is not None else cloud.node_count
    if high < 1:
        raise pool.refuse(("cloud", "max_node_count"), "an EKS node group needs a maximum size of at least 1",
                          "set cloud.max_node_count (or node_count) to 1 or more")
    if not low <= cloud.node_count <= high:
        raise pool.refuse(("cloud", "node_count"), f"node_count {cloud.node_count} is outside {low}..{high}",
                          "keep node_count between min_node_count and max_node_count")
    return {"desired_size": cloud.node_count, "min_size": low, "max_size": high}


def refusals(pool: CloudPool) -> list[Refusal]:
    """Every rule the environment file alone decides (the stack's GKE location is checked by the program)."""
    checks: list[Callable[[CloudPool], object]]
    if pool.kind == "gke":
        checks = [gke_accelerator, *([gke_sharing] if pool.gke_managed else [])]
        if pool.cloud.zones:
            checks.append(lambda p: per_zone(p, len(p.cloud.zones)))
    else:
        checks = [eks_scaling]
    found = []
    for check in checks:
        try:
            check(pool)
        except PoolRefused as refused:
            found.append(refused.refusal)
    return found
