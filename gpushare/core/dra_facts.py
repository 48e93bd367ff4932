"""The DRA vocabulary the resolver and the DRA compiler share: profile kinds, NVIDIA's DRA driver facts and
feature gates, what each profile kind needs on a DRA cluster, DeviceClass names and Kueue's limits on their mappings.
It sits below gpushare.core.resolve (which checks a cluster with it) and gpushare.core.dra (which compiles the
resolved fleet to DRA objects), so neither imports the other."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpushare.core import kubeversions, spec
from gpushare.core.paths import package_data_path
from gpushare.core.reading import load_yaml_file

if TYPE_CHECKING:
    from gpushare.core.catalog import GpuModel

RESOURCE_API = "resource.k8s.io/v1"
CLASS_PREFIX = "gpushare-"
MANAGED = {"app.kubernetes.io/managed-by": "gpushare"}
PROFILE_LABEL = "gpushare.io/profile"
REQUEST_NAME = "gpu"
QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"
HARDWARE_ISOLATED = ("exclusive", "mig")
TIME_SLICED = ("time-slicing", "mig-time-slicing")
MIG_KINDS = ("mig", "mig-time-slicing")
DYNAMIC_MIG = "DynamicMIG"  # the driver gate behind mig_mode: dynamic
# Kueue v0.19.2 pkg/config/validation.go validateDeviceClassMappings: at most 16 mappings, 8 classes in each.
KUEUE_MAX_MAPPINGS = 16
KUEUE_MAX_CLASSES_PER_MAPPING = 8
QUALIFIED_NAME_MAX = 63  # the name part of a qualified name (after any '/')


# ---------------------------------------------------------------- the driver's facts


@dataclass(frozen=True)
class FeatureGate:
    name: str
    maturity: str  # alpha, beta, ga
    default: bool
    since: tuple[int, int]  # driver minor the gate appeared in


@dataclass(frozen=True)
class DriverFacts:
    default_version: str
    releases: dict[str, frozenset[str]]  # driver release -> the gates it registers
    driver_name: str
    driver_device_classes: tuple[str, ...]
    extended_resource_name: str
    gates: dict[str, FeatureGate]
    mutually_exclusive: tuple[tuple[str, str], ...]
    requires: dict[str, str]
    consumable_shares_gate: str
    config_api: str
    strategies: dict[str, str]  # sharing strategy -> gate it needs
    intervals: tuple[str, ...]
    config_kinds: dict[str, dict[str, str]]
    config_types: dict[str, dict[str, str]]
    consumable_capacity: str  # the capacity --consumable-shares publishes on every device
    dynamic_mig_ampere: frozenset[str]  # MIG-capable models DynamicMIG publishes partitionable only with MIG on


def _minor(version: str) -> tuple[int, int]:
    major, minor, *_ = spec.version_tuple(version)
    return major, minor


@functools.cache
def driver_facts() -> DriverFacts:
    _, raw = load_yaml_file(package_data_path("dra-driver-nvidia-gpu.yaml"), "DRA driver facts")
    config = raw["config"]
    return DriverFacts(
        default_version=raw["default_version"],
        releases={version: frozenset(gates) for version, gates in raw["releases"].items()},
        driver_name=raw["driver_name"],
        driver_device_classes=tuple(raw["driver_device_classes"]),
        extended_resource_name=raw["extended_resource_name"],
        gates={name: FeatureGate(name, g["maturity"], g["default"], _minor(g["since"]))
               for name, g in raw["feature_gates"].items()},
        mutually_exclusive=tuple((a, b) for a, b in raw["mutually_exclusive"]),
        requires=dict(raw["requires"]),
        consumable_shares_gate=raw["consumable_shares"]["gate"],
        config_api=config["apiVersion"],
        strategies=dict(config["sharing_strategies"]),
        intervals=tuple(config["time_slice_intervals"]),
        config_kinds={k: dict(v["fields"]) for k, v in config["kinds"].items()},
        config_types={k: dict(v) for k, v in config["types"].items()},
        consumable_capacity=raw["consumable_shares"]["capacity"],
        dynamic_mig_ampere=frozenset(raw["dynamic_mig_ampere"]),
    )


def is_dra(cluster: spec.Cluster) -> bool:
    return cluster.gpu_allocation == "dra"


def driver_version(cluster: spec.Cluster) -> str:
    return cluster.dra_driver.version or driver_facts().default_version


def version_problems(version: str) -> list[tuple[str, str]]:
    """(message, fix) when gpushare does not know the gate table of this driver version."""
    known = list(driver_facts().releases)
    if version in known:
        return []
    return [(f"DRA driver {version} is not a release gpushare knows the feature gates of",
             f"pin one of {', '.join(known)} (or leave version out for {driver_facts().default_version})")]


def gates_available(version: str) -> frozenset[str]:
    return driver_facts().releases.get(version, frozenset())


def first_release_with(gate: str) -> str | None:
    return next((v for v, gates in driver_facts().releases.items() if gate in gates), None)


def gate_problems(version: str, gates: Iterable[str]) -> list[tuple[str, str, str]]:
    """(gate, message, fix) for every gate the driver at `version` lacks, and every pair it refuses to start with
    (counting the gates it turns on by default)."""
    facts = driver_facts()
    available = gates_available(version)
    asked = list(dict.fromkeys(gates))
    out: list[tuple[str, str, str]] = []
    for gate in asked:
        if gate not in facts.gates:
            out.append((gate, f"{gate} is not a feature gate of NVIDIA's DRA driver",
                        f"use one of: {', '.join(sorted(facts.gates))}"))
        elif gate not in available:
            first = first_release_with(gate)
            out.append((gate, f"DRA driver {version} lacks feature gate {gate}",
                        f"pin dra.version {first} or later, or do without {gate}" if first
                        else f"do without {gate}: no release gpushare knows has it"))
    on = {g for g in asked if g in available} | {g.name for g in facts.gates.values() if g.default}
    for a, b in facts.mutually_exclusive:
        if a in on and b in on:
            out.append((b if b in asked else a, f"the DRA driver refuses feature gates {a} and {b} together",
                        f"turn one of them off: e.g. no dynamic MIG pools on this cluster, or drop {b}"))
    for gate, needed in facts.requires.items():
        if gate in on and needed not in on:
            out.append((gate, f"feature gate {gate} needs {needed}", f"add {needed} to dra.feature_gates"))
    return out


def alpha_gates(gates: Iterable[str]) -> list[str]:
    facts = driver_facts()
    return sorted({g for g in gates if g in facts.gates and facts.gates[g].maturity == "alpha"})


# ---------------------------------------------------------------- what a profile needs on a DRA cluster


def profile_gates(kind: str, mig_mode: str = "static") -> set[str]:
    """Driver gates a profile kind (in a pool of this mig_mode) needs on a DRA cluster."""
    gates: set[str] = set()
    if kind in TIME_SLICED:
        gates |= {"TimeSlicingSettings", driver_facts().consumable_shares_gate}
    if kind in MIG_KINDS and mig_mode == "dynamic":
        gates.add(DYNAMIC_MIG)
    return gates


# Kubernetes gates the driver's features rest on: without them the API server drops the fields (capacity,
# allowMultipleAllocations, shared counters) and claims silently take whole devices. name -> first minor where on
# by default, from the per-minor table in gpushare.core.kubeversions.
KUBERNETES_GATES: dict[str, tuple[int, ...] | None] = {
    g: kubeversions.DRA_DEFAULT_ON[g] for g in ("DRAConsumableCapacity", "DRAPartitionableDevices")}


def kubernetes_gates_needed(kind: str, mig_mode: str, kubernetes_minor: tuple[int, ...]) -> set[str]:
    """Kubernetes feature gates a profile kind (in a pool of this mig_mode) needs on a cluster of that minor."""
    needed = set()
    if kind in TIME_SLICED:
        needed.add("DRAConsumableCapacity")
    if kind in MIG_KINDS and mig_mode == "dynamic":
        needed.add("DRAPartitionableDevices")
    return {g for g in needed if (on_from := KUBERNETES_GATES[g]) is None or kubernetes_minor < on_from}


# k8s.io/dynamic-resource-allocation, structured allocator: a device allocated with consumable capacity
# (allowMultipleAllocations, which the driver's consumable shares set on every device) is recorded as a shared device.
# Up to 1.35 (v0.35.8 allocator_experimental.go, "Devices that aren't allocated doesn't consume any counters")
# the counters it consumes are subtracted only for devices in AllocatedDevices, which shared ones are not: the
# scheduler gives the same memory slices to claim after claim. 1.36 counts them (allocatedstate.go IsDeviceAllocated,
# AllocatedSharedDeviceIDs). Seen with the real kube-scheduler in tests/cluster/test_dra_partitionable.py.
SHARED_COUNTERS_COUNTED_FROM = (1, 36)


def counters_refusal(kubernetes_minor: tuple[int, ...]) -> tuple[str, str] | None:
    """(message, fix) for dynamic MIG beside consumable shares on a minor whose scheduler overcommits counters."""
    if tuple(kubernetes_minor[:2]) >= SHARED_COUNTERS_COUNTED_FROM:
        return None
    return ("dynamic MIG beside time-slicing overcommits GPUs on this Kubernetes minor: the time-sliced profiles turn "
            "the driver's consumable shares on, every device then allows multiple allocations, and before 1.36 "
            "kube-scheduler subtracts no counters for such a device once it is allocated, so it gives the same MIG "
            "memory slices (and a whole GPU) to one claim after another, whichever tenants hold them",
            "upgrade the cluster to Kubernetes 1.36 or later (and set kubernetes_version), or put the time-sliced "
            "pools on another DRA cluster or a device-plugin cluster")


def shares_refusal(model: GpuModel, kind: str, dynamic_mig: bool) -> tuple[str, str] | None:
    """(message, fix) for a time-sliced profile whose devices the driver publishes with SM and engine capacities:
    MIG devices always (static: GetDevice; dynamic: PartGetDevice), and with DynamicMIG on in the cluster the full
    device of a MIG-capable GPU that toggles MIG without a reset (Hopper and newer; dra-driver-nvidia-gpu.yaml
    `dynamic_mig_ampere`). Consumable shares give those capacities no request policy, so kube-scheduler consumes them
    whole for the first claim and no second claim shares the device. None where time-slicing across pods works."""
    if kind not in TIME_SLICED:
        return None
    if kind in MIG_KINDS:
        what = "MIG devices with their SM, engine and memory-slice capacities"
    elif dynamic_mig and model.mig_capable and model.name not in driver_facts().dynamic_mig_ampere:
        what = (f"{model.name} GPUs, with DynamicMIG on in the cluster, as partitionable devices with their SM and "
                "engine capacities")
    else:
        return None
    return (f"time-slicing would share nothing: the DRA driver publishes {what}, and its consumable shares give those "
            "capacities no request policy, so the scheduler lets the first claim consume them whole and no second "
            "claim ever shares the device (one pod per device, as exclusive)",
            "use an exclusive or MIG profile here, or put the time-sliced pool on GPUs without MIG on a DRA cluster "
            "without dynamic MIG pools, or on a device-plugin cluster")


def profile_refusals(kind: str, version: str) -> list[tuple[str, str]]:
    """(message, fix) why a DRA cluster whose driver is at `version` cannot give this profile kind its meaning."""
    if kind == "mps":
        return [("MPS shares a GPU across pods only through the device plugin: a DRA claim's MPS config shares the "
                 "GPU among that one claim's pods, and the driver refuses MPS with ConsumableShares",
                 "put this pool on a device-plugin cluster, or use a time-slicing, MIG or exclusive profile")]
    if kind in TIME_SLICED and not version_problems(version):  # an unknown version is reported once, itself
        gate = driver_facts().consumable_shares_gate
        if gate not in gates_available(version):
            return [(f"time-slicing across pods on DRA needs the driver's {gate} gate, which DRA driver {version} "
                     "lacks (a claim's time-slicing config shares a GPU only among that claim's pods)",
                     f"pin dra.version {first_release_with(gate)} or later, put this pool on a device-plugin "
                     "cluster, or use a MIG or exclusive profile")]
    return []


class DraNode(Protocol):
    """What a DeviceClass plan reads of a node: gpushare.core.resolve.ResolvedNode, typed here without importing it."""

    @property
    def profile(self) -> str: ...
    @property
    def sharing(self) -> str: ...
    @property
    def mig_layout(self) -> dict[str, int] | None: ...
    @property
    def advertised(self) -> dict[str, int]: ...
    @property
    def gpu_model(self) -> GpuModel: ...


# ---------------------------------------------------------------- DeviceClass plans and Kueue's limits on them


@dataclass(frozen=True)
class DeviceClassPlan:
    """One gpushare DeviceClass: what it selects, its opaque config and the quota name it counts as."""

    name: str
    profile: str
    kind: str
    instance: str | None  # MIG instance profile, for MIG kinds
    models: tuple[str, ...]  # NVML product names, as the driver publishes productName
    resource: str  # the device-plugin resource name of the same profile
    hardware_isolated: bool


def class_name(profile: str, instance: str | None = None) -> str:
    return CLASS_PREFIX + profile + (f"-{instance.replace('+', '.')}" if instance else "")


def _instance_resource(node: DraNode, instance: str) -> str:
    suffix = instance.replace("+", ".")
    named = [r for r in node.advertised if r in (f"nvidia.com/mig-{suffix}", f"nvidia.com/mig-{suffix}.shared")]
    if named:
        return named[0]
    return next(iter(node.advertised))  # mig_strategy single: every instance is one resource


def plans_for_nodes(nodes: Iterable[DraNode]) -> list[DeviceClassPlan]:
    """The DeviceClasses that the profiles of these nodes (all in one DRA cluster) compile to."""
    found: dict[str, tuple[str, str, str | None, set[str], str]] = {}
    for node in nodes:
        if not node.advertised:
            continue
        if node.mig_layout:
            for instance in node.mig_layout:
                name = class_name(node.profile, instance)
                entry = found.setdefault(name, (node.profile, node.sharing, instance, set(),
                                                _instance_resource(node, instance)))
                entry[3].add(node.gpu_model.name)
        else:
            name = class_name(node.profile)
            entry = found.setdefault(name, (node.profile, node.sharing, None, set(), next(iter(node.advertised))))
            entry[3].add(node.gpu_model.name)
    return [DeviceClassPlan(name=name, profile=p, kind=k, instance=i, models=tuple(sorted(models)), resource=r,
                            hardware_isolated=k in HARDWARE_ISOLATED)
            for name, (p, k, i, models, r) in sorted(found.items())]


# Kueue 0.19.2 counts a claim by the capacity it consumes (pkg/dra/capacity.go) when its DeviceClass's mapping has a
# capacity source; that needs this gate (pkg/features/kube_features.go: alpha in 0.19, off by default;
# pkg/config/validation.go refuses capacity sources without it).
KUEUE_CAPACITY_GATE = "KueueDRAIntegrationConsumableCapacity"


def mappings_for_plans(plans: Iterable[DeviceClassPlan]) -> list[dict[str, Any]]:
    """Kueue's deviceClassMappings: one per quota resource. A claim on a class counts as one device of its resource
    (as the device plugin's resources count), except where every class of the resource time-slices: there Kueue
    counts the `shares` each claim consumes on the driver's devices (one per claim from gpushare's templates, as one
    replica), read from the devices the claim can get. MIG classes stay device counts: Kueue's counter sources charge
    a claim a counter's value (SMs, bytes of memory) of the profile on the devices it matches, a unit in which
    gpushare's per-profile quotas would have to be restated from the driver's exact counter values."""
    by_resource: dict[str, list[DeviceClassPlan]] = {}
    for plan in plans:
        by_resource.setdefault(plan.resource, []).append(plan)
    facts = driver_facts()
    out = []
    for resource, group in sorted(by_resource.items()):
        mapping: dict[str, Any] = {"name": resource, "deviceClassNames": sorted(p.name for p in group)}
        if all(p.kind in TIME_SLICED for p in group):
            mapping["sources"] = [{"capacity": {
                "name": facts.consumable_capacity, "driver": facts.driver_name,
                "deviceSelector": {"cel": {"expression": f"device.driver == '{facts.driver_name}'"}}}}]
        out.append(mapping)
    return out


def kueue_feature_gates(mappings: list[dict[str, Any]]) -> dict[str, bool]:
    """The Kueue feature gates the mappings need beyond Kueue's defaults."""
    return {KUEUE_CAPACITY_GATE: True} if any("capacity" in s for m in mappings for s in m.get("sources", [])) else {}


def mapping_problems(plans: list[DeviceClassPlan]) -> list[tuple[str, str]]:
    """(message, fix) where Kueue's configuration validation would refuse the cluster's mappings."""
    return mapping_limit_problems(mappings_for_plans(plans))


def mapping_limit_problems(mappings: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(message, fix) for deviceClassMappings Kueue's configuration validation refuses (the manager would not
    start): more than 16 mappings, more than 8 classes in one, class names over 63 characters."""
    out = []
    if len(mappings) > KUEUE_MAX_MAPPINGS:
        out.append((f"the cluster's profiles need {len(mappings)} Kueue deviceClassMappings (one per quota resource); "
                    f"Kueue accepts at most {KUEUE_MAX_MAPPINGS}",
                    "use fewer distinct MIG instance profiles on this cluster"))
    for m in mappings:
        if len(m["deviceClassNames"]) > KUEUE_MAX_CLASSES_PER_MAPPING:
            out.append((f"{len(m['deviceClassNames'])} DeviceClasses count as {m['name']}; Kueue maps at most "
                        f"{KUEUE_MAX_CLASSES_PER_MAPPING} classes to one resource",
                        "use fewer profiles with this MIG instance on this cluster"))
        out += [(f"DeviceClass {c} is longer than the {QUALIFIED_NAME_MAX} characters Kueue accepts in "
                 "deviceClassMappings", "use a shorter profile name") for c in m["deviceClassNames"]
                if len(c.rsplit("/", 1)[-1]) > QUALIFIED_NAME_MAX]
    return out
