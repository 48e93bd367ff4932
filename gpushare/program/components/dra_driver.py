"""DraDriver: NVIDIA's DRA driver for GPUs on a cluster with `gpu_allocation: dra` (docs/dra.md), and gpushare's
DeviceClasses for it. The driver comes either as its own pinned Helm chart beside the GPU Operator (whose device
plugin is then off; the operator keeps driver, toolkit, mig-manager and DCGM), or through the operator's GPUCluster
resource (experimental, new clusters only). Values are pure functions, checked before any resource exists."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pulumi
import yaml
from pulumi_kubernetes.helm.v3 import Release
from pulumi_kubernetes.resource.v1 import DeviceClass

from gpushare.core import dra, spec
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.paths import package_data
from gpushare.core.resolve import ResolvedFleet
from gpushare.program.components import operator_values as ov
from gpushare.program.stack_config import ChartSource

CHART = "oci://registry.k8s.io/dra-driver-nvidia/charts/dra-driver-nvidia-gpu"
RELEASE = "nvidia-dra-driver-gpu"
NAMESPACE = ov.NAMESPACE  # beside the operator: the namespace already admits privileged pods and is never a tenant's
VALUES_FILE = "dra-driver-values.yaml"
# Where the GPU Operator's driver container puts the driver root on the host (its hostPaths.driverInstallDir).
OPERATOR_DRIVER_ROOT = "/run/nvidia/driver"
CONSUMABLE_SHARES_ENV = "CONSUMABLE_SHARES"


@cache
def chart_defaults() -> dict[str, Any]:
    data = yaml.safe_load(package_data(VALUES_FILE).read_text())
    assert isinstance(data, dict)
    return data


def chart_version(cluster: spec.Cluster) -> str:
    """The chart is versioned as the driver, without the leading v (Helm's strict semver)."""
    return dra.driver_version(cluster).removeprefix("v")


def driver_root(gpus: ov.ClusterGpus) -> str:
    """Where the driver's files are on the hosts: one place for the whole cluster (the chart takes one value)."""
    if gpus.mixed:
        raise GpushareError(Problem(
            f"cluster {gpus.cluster.name} mixes Ansible-managed and operator-managed hosts: the DRA driver takes one "
            "nvidiaDriverRoot for every node, and the two kinds keep the driver in different places",
            fix="put the DRA cluster's hosts under one manager (managed_by), or keep the cluster on the device plugin"))
    if gpus.cluster.kind == "gke":
        return ov.GKE_INSTALL_DIR
    return OPERATOR_DRIVER_ROOT if gpus.needs_driver else "/"


def chart_values(fleet: ResolvedFleet, gpus: ov.ClusterGpus) -> dict[str, Any]:
    """Values for the driver's chart. The device plugin is off on this cluster, which is what the chart's
    gpuResourcesEnabledOverride asserts; compute domains (multi-node NVLink) are not part of gpushare's profiles."""
    cluster = gpus.cluster
    values: dict[str, Any] = {
        "nvidiaDriverRoot": driver_root(gpus),
        "gpuResourcesEnabledOverride": True,
        "resourceApiVersion": dra.RESOURCE_API,  # never auto-detected: gpushare's objects are v1
        "resources": {"gpus": {"enabled": True}, "computeDomains": {"enabled": False}},
        "featureGates": dra.feature_gates(fleet, cluster.name),
        "kubeletPlugin": {"tolerations": ov.with_tolerations(chart_defaults()["kubeletPlugin"]["tolerations"],
                                                             gpus.taints)},
    }
    shares = dra.consumable_shares(fleet, cluster.name)
    if shares is not None:
        values["consumableShares"] = str(shares)
    return values


def unknown_keys(values: dict[str, Any], defaults: dict[str, Any] | None = None, path: str = "") -> list[str]:
    """Value paths the pinned chart's values.yaml does not have; below an empty map in it any key is allowed."""
    defaults = chart_defaults() if defaults is None else defaults
    found = []
    for key, value in values.items():
        where = f"{path}.{key}" if path else key
        if key not in defaults:
            found.append(where)
        elif isinstance(value, dict) and isinstance(defaults[key], dict) and defaults[key]:
            found += unknown_keys(value, defaults[key], where)
    return found


def check_chart_values(values: dict[str, Any]) -> list[Problem]:
    return [Problem(f"DRA driver chart has no value {path!r}",
                    fix=f"use a key from the pinned chart's values.yaml (gpushare/data/{VALUES_FILE})")
            for path in unknown_keys(values)]


def operator_values(values: dict[str, Any], fleet: ResolvedFleet, cluster: spec.Cluster) -> dict[str, Any]:
    """The GPU Operator's values on a DRA cluster. `chart`: its device plugin off, everything else as before.
    `gpu-cluster`: a GPUCluster instead of the ClusterPolicy, with the driver's gates and shares in draDriver."""
    out = copy.deepcopy(values)
    # Its settings stay as computed (safe strategies), so turning it back on cannot widen access.
    out["devicePlugin"]["enabled"] = False
    if cluster.dra_driver.install == "chart":
        return out
    env = []
    shares = dra.consumable_shares(fleet, cluster.name)
    if shares is not None:
        env.append({"name": CONSUMABLE_SHARES_ENV, "value": str(shares)})
    out["clusterPolicy"] = {"deployCR": False}
    out["gpuCluster"] = {"deployCR": True}
    out["draDriver"] = {"version": dra.driver_version(cluster),
                        "featureGates": dra.feature_gates(fleet, cluster.name),
                        "gpus": {"kubeletPlugin": {"env": env}} if env else {},
                        "computeDomains": {"enabled": False}}
    return out


# ---------------------------------------------------------------- the component


@dataclass
class DraDriverArgs:
    fleet: ResolvedFleet
    cluster: spec.Cluster
    gpus: ov.ClusterGpus
    provider: pulumi.ProviderResource | None = None
    # The GPU Operator's release: driver and toolkit before the DRA driver starts.
    after: list[pulumi.Resource] = field(default_factory=list)
    protect: bool = False
    charts: ChartSource = field(default_factory=ChartSource)


@dataclass(frozen=True)
class PreparedDriver:
    values: dict[str, Any] | None  # None where the operator's GPUCluster installs the driver
    device_classes: list[dict[str, Any]]


def prepare(args: DraDriverArgs) -> PreparedDriver:
    """The driver's values (chart installs) and gpushare's DeviceClasses, checked before any resource exists."""
    cluster = args.cluster
    values = chart_values(args.fleet, args.gpus) if cluster.dra_driver.install == "chart" else None
    problems = [Problem(f"cluster {cluster.name}: {p.message}", fix=p.fix)
                for p in (check_chart_values(values) if values is not None else [])]
    if problems:
        raise GpushareError(problems)
    return PreparedDriver(values, dra.device_classes(args.fleet, cluster.name))


class DraDriver(pulumi.ComponentResource):
    def __init__(self, name: str, args: DraDriverArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpushare:nvidia:DraDriver", name, None, opts)
        prepared = prepare(args)
        if args.provider is None:
            raise GpushareError(f"cluster {args.cluster.name!r}: the DRA driver needs the cluster's provider")
        k8s = pulumi.ResourceOptions(parent=self, provider=args.provider)
        after = pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(depends_on=args.after))
        driver: list[pulumi.Resource] = list(args.after)
        if prepared.values is not None:
            driver = [Release(
                f"{name}-chart", name=RELEASE,
                **args.charts.release_args("dra-driver", CHART, chart_version(args.cluster)),
                namespace=NAMESPACE, values=prepared.values,
                opts=pulumi.ResourceOptions.merge(after, pulumi.ResourceOptions(protect=args.protect)))]
        else:
            pulumi.log.warn(f"cluster {args.cluster.name}: the DRA driver comes through the GPU Operator's GPUCluster, "
                            "a technology preview for new clusters only (docs/dra.md)")
        classes = pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(depends_on=driver))
        for obj in prepared.device_classes:
            DeviceClass(f"{name}-class-{obj['metadata']['name']}", metadata=obj["metadata"], spec=obj["spec"],
                        opts=classes)
        self.register_outputs({"classes": [o["metadata"]["name"] for o in prepared.device_classes]})
