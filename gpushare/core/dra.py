"""Dynamic Resource Allocation: one sharing profile compiled to the DRA objects of NVIDIA's DRA driver for GPUs.

Conventions (shared by the resolver, tenancy, the Pulumi program, admission and `gpushare plan`):
- A cluster says how pods get GPUs: `gpu_allocation: device-plugin` (default) or `dra`. A DRA cluster needs
  Kubernetes 1.34+ (resource.k8s.io/v1) and may carry a `dra:` block: driver `version` (default: the one the pinned
  GPU Operator names), `install` (`chart`, or `gpu-cluster`: the operator's experimental GPUCluster resource, never
  beside a ClusterPolicy) and extra `feature_gates` (checked against the version's gate table).
- Pools on DRA clusters choose `mig_mode`: `static` (mig-parted applies the profile's layout, as today) or `dynamic`
  (the driver creates MIG instances per claim; needs DynamicMIG). The exact MIG check applies to both. DynamicMIG is
  cluster-wide and destroys at start every MIG instance the driver did not create: one cluster, one MIG mode.
- One DeviceClass per sharing profile used on the cluster, `gpushare-<profile>`; for MIG profiles one per (profile,
  MIG instance profile) the layouts contain, `gpushare-<profile>-<instance>` ('+' written '.', as in resource
  names). Each carries CEL selectors on the driver's attributes (type, productName, MIG profile) and the profile's
  opaque config (GpuConfig / MigDeviceConfig). In each tenant namespace a ResourceClaimTemplate of the same name per
  class the tenant may use (untrusted tenants: hardware-isolated profiles only), with one `exactly` request: Kueue
  admits nothing else. Every object carries `app.kubernetes.io/managed-by: gpushare`.
- Quota: Kueue's `deviceClassMappings` maps each class to the resource name the device-plugin path advertises for
  the profile (`nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-3g.40gb`), so one tenant quota counts on
  both kinds of cluster. Tenant ResourceQuotas add `<class>.deviceclass.resource.k8s.io/devices`, and 0 for the
  driver's own classes so no claim bypasses gpushare's classes.
- Time-slicing across pods needs the driver's ConsumableShares gate (alpha, driver v0.5+; Kubernetes'
  DRAConsumableCapacity feature on the cluster): every GPU and MIG device then publishes `shares` = the profiles'
  replicas, a shared claim takes one, and hardware-isolated claims request all of them. MPS across pods has no DRA
  form (the driver refuses MPS with consumable shares), so MPS profiles are refused on DRA clusters.
Facts come from `gpushare/data/dra-driver-nvidia-gpu.yaml` (copied from the driver's source; see its header)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpushare.core import spec
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import load_yaml_file
from gpushare.core.paths import package_data_path

if TYPE_CHECKING:
    from gpushare.core.resolve import ResolvedFleet, ResolvedNode, ResolvedTenant

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
# allowMultipleAllocations, shared counters) and claims silently take whole devices. name -> first minor where on.
KUBERNETES_GATES: dict[str, tuple[int, ...] | None] = {"DRAConsumableCapacity": None,
                                                       "DRAPartitionableDevices": (1, 36)}


def kubernetes_gates_needed(kind: str, mig_mode: str, kubernetes_minor: tuple[int, ...]) -> set[str]:
    """Kubernetes feature gates a profile kind (in a pool of this mig_mode) needs on a cluster of that minor."""
    needed = set()
    if kind in TIME_SLICED:
        needed.add("DRAConsumableCapacity")
    if kind in MIG_KINDS and mig_mode == "dynamic":
        needed.add("DRAPartitionableDevices")
    return {g for g in needed if (on_from := KUBERNETES_GATES[g]) is None or kubernetes_minor < on_from}


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


# ---------------------------------------------------------------- the DeviceClasses of a cluster


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


def _instance_resource(node: ResolvedNode, instance: str) -> str:
    suffix = instance.replace("+", ".")
    named = [r for r in node.advertised if r in (f"nvidia.com/mig-{suffix}", f"nvidia.com/mig-{suffix}.shared")]
    if named:
        return named[0]
    return next(iter(node.advertised))  # mig_strategy single: every instance is one resource


def _dra_nodes(fleet: ResolvedFleet, cluster: str) -> list[ResolvedNode]:
    if not is_dra(fleet.clusters[cluster]):
        return []
    return [n for p in fleet.pools if p.cluster == cluster for n in p.nodes]


def class_plans(fleet: ResolvedFleet, cluster: str) -> list[DeviceClassPlan]:
    """The gpushare DeviceClasses of a DRA cluster (none on a device-plugin cluster), by name."""
    return plans_for_nodes(_dra_nodes(fleet, cluster))


def plans_for_nodes(nodes: Iterable[ResolvedNode]) -> list[DeviceClassPlan]:
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


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def selector(plan: DeviceClassPlan) -> str:
    """The CEL expression that picks the class's devices from the driver's ResourceSlices."""
    driver = driver_facts().driver_name
    attrs = f"device.attributes[{_cel_string(driver)}]"
    parts = [f"device.driver == {_cel_string(driver)}",
             f"{attrs}.type == {_cel_string('mig' if plan.instance else 'gpu')}"]
    if plan.instance:
        parts.append(f"{attrs}.profile == {_cel_string(plan.instance)}")
    models = ", ".join(_cel_string(m) for m in plan.models)
    parts.append(f"{attrs}.productName in [{models}]")
    return " && ".join(parts)


def opaque_config(plan: DeviceClassPlan, fleet: ResolvedFleet) -> dict[str, Any]:
    """The driver's opaque config for the class: GpuConfig for whole GPUs, MigDeviceConfig for MIG devices."""
    api = driver_facts().config_api
    if plan.instance is None:
        body: dict[str, Any] = {"apiVersion": api, "kind": "GpuConfig"}
        if plan.kind == "time-slicing":
            body["sharing"] = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}
        elif plan.kind == "mps":  # refused by the resolver; spelled out for `gpushare plan`
            mps = fleet.profiles[plan.profile].mps
            body["sharing"] = {"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": max(1, 100 // mps.replicas)}}
        return body
    body = {"apiVersion": api, "kind": "MigDeviceConfig"}
    if plan.kind == "mig-time-slicing":
        body["sharing"] = {"strategy": "TimeSlicing"}  # MIG devices have no time-slice interval
    return body


def device_classes(fleet: ResolvedFleet, cluster: str) -> list[dict[str, Any]]:
    """DeviceClass objects (resource.k8s.io/v1) for the cluster's profiles; empty on device-plugin clusters."""
    out = []
    for plan in class_plans(fleet, cluster):
        labels = {**MANAGED, PROFILE_LABEL: plan.profile}
        out.append({
            "apiVersion": RESOURCE_API, "kind": "DeviceClass",
            "metadata": {"name": plan.name, "labels": labels},
            "spec": {
                "selectors": [{"cel": {"expression": selector(plan)}}],
                "config": [{"opaque": {"driver": driver_facts().driver_name,
                                       "parameters": opaque_config(plan, fleet)}}],
            },
        })
    return out


# ---------------------------------------------------------------- feature gates and consumable shares


def consumable_shares(fleet: ResolvedFleet, cluster: str) -> int | None:
    """The driver's --consumable-shares count for the cluster: the time-slicing replicas its profiles share
    (the resolver refuses profiles that disagree); None when no profile on it time-slices."""
    counts = {fleet.profiles[p.profile].time_slicing.replicas for p in class_plans(fleet, cluster)
              if p.kind in TIME_SLICED}
    return max(counts) if counts else None


def _pool_mig_modes(fleet: ResolvedFleet, cluster: str) -> dict[str, str]:
    return {p.name: p.mig_mode for p in fleet.env.pools if p.cluster == cluster}


def required_gates(fleet: ResolvedFleet, cluster: str) -> set[str]:
    modes = _pool_mig_modes(fleet, cluster)
    return {g for n in _dra_nodes(fleet, cluster) for g in profile_gates(n.sharing, modes.get(n.pool, "static"))}


def feature_gates(fleet: ResolvedFleet, cluster: str) -> dict[str, bool]:
    """The driver's feature gates for the cluster (the chart's `featureGates`): those the profiles in use need
    plus the user's extras. Raises GpushareError where the pinned version lacks one or refuses a pair."""
    c = fleet.clusters[cluster]
    if not is_dra(c):
        return {}
    version = driver_version(c)
    gates = sorted(required_gates(fleet, cluster) | set(c.dra_driver.feature_gates))
    problems = [Problem(f"cluster {cluster}: {message}", fix=fix) for message, fix in version_problems(version)]
    problems += [Problem(f"cluster {cluster}: {message}", fix=fix) for _, message, fix in gate_problems(version, gates)]
    if problems:
        raise GpushareError(problems)
    return {g: True for g in gates}


# ---------------------------------------------------------------- tenants: claim templates, admission, quota


def _tenant_plans(fleet: ResolvedFleet, cluster: str, tenant: ResolvedTenant) -> list[DeviceClassPlan]:
    if cluster not in tenant.clusters:
        return []
    return [p for p in class_plans(fleet, cluster) if tenant.trust == "trusted" or p.hardware_isolated]


def allowed_templates(fleet: ResolvedFleet, cluster: str, tenant: ResolvedTenant) -> set[str]:
    """Names of the claim templates a tenant's pods may reference on the cluster (untrusted: hardware-isolated)."""
    return {p.name for p in _tenant_plans(fleet, cluster, tenant)}


def claim_templates(fleet: ResolvedFleet, cluster: str, tenant: ResolvedTenant) -> list[dict[str, Any]]:
    """ResourceClaimTemplates in the tenant's namespace, one per class it may use, each one `exactly` request
    for one device. With consumable shares on, hardware-isolated claims take every share, so nothing joins them."""
    shares = consumable_shares(fleet, cluster)
    out = []
    for plan in _tenant_plans(fleet, cluster, tenant):
        exactly: dict[str, Any] = {"deviceClassName": plan.name, "allocationMode": "ExactCount", "count": 1}
        if shares is not None and plan.hardware_isolated:
            exactly["capacity"] = {"requests": {"shares": str(shares)}}
        out.append({
            "apiVersion": RESOURCE_API, "kind": "ResourceClaimTemplate",
            "metadata": {"name": plan.name, "namespace": tenant.namespace,
                         "labels": {**MANAGED, PROFILE_LABEL: plan.profile}},
            "spec": {"spec": {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}}},
        })
    return out


def kueue_device_class_mappings(fleet: ResolvedFleet, cluster: str) -> list[dict[str, Any]]:
    """Kueue Configuration `resources.deviceClassMappings`: each quota resource and the classes counted as it.
    A claim on a class no mapping names is rejected by Kueue, never admitted with zero usage."""
    return mappings_for_plans(class_plans(fleet, cluster))


def mappings_for_plans(plans: Iterable[DeviceClassPlan]) -> list[dict[str, Any]]:
    by_resource: dict[str, list[str]] = {}
    for plan in plans:
        by_resource.setdefault(plan.resource, []).append(plan.name)
    return [{"name": r, "deviceClassNames": sorted(names)} for r, names in sorted(by_resource.items())]


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


def dra_quota_resources(fleet: ResolvedFleet, cluster: str, tenant: ResolvedTenant,
                        limits: dict[str, int]) -> dict[str, str]:
    """ResourceQuota `hard` entries for DRA devices in the tenant's namespace: per gpushare class the tenant's
    limit on the class's resource (0 for classes it may not use), and 0 for the driver's own classes."""
    if not is_dra(fleet.clusters[cluster]):
        return {}
    allowed = allowed_templates(fleet, cluster, tenant)
    hard = {f"{name}{QUOTA_SUFFIX}": "0" for name in driver_facts().driver_device_classes}
    for plan in class_plans(fleet, cluster):
        count = limits.get(plan.resource, 0) if plan.name in allowed else 0
        hard[f"{plan.name}{QUOTA_SUFFIX}"] = str(count)
    return dict(sorted(hard.items()))


# ---------------------------------------------------------------- checking opaque configs against the driver


def config_problems(parameters: Any) -> list[str]:
    """What the driver's strict decoder and Validate() would refuse in an opaque GpuConfig/MigDeviceConfig:
    unknown kinds, misspelt fields, unknown strategies and intervals, out-of-range values."""
    facts = driver_facts()
    if not isinstance(parameters, dict):
        return ["opaque parameters are not an object"]
    if parameters.get("apiVersion") != facts.config_api:
        return [f"apiVersion {parameters.get('apiVersion')!r} is not {facts.config_api}"]
    kind = parameters.get("kind")
    if kind not in facts.config_kinds:
        return [f"kind {kind!r} is not one of {', '.join(sorted(facts.config_kinds))}"]
    return _fields(parameters, facts.config_kinds[kind], kind)


def _fields(value: dict[str, Any], fields: dict[str, str], where: str) -> list[str]:
    facts = driver_facts()
    problems = [f"{where}: unknown field {k!r} (known: {', '.join(fields)})" for k in value if k not in fields]
    for key, kind in fields.items():
        if key not in value:
            if kind == "strategy":
                problems.append(f"{where}: missing {key}")
            continue
        item, here = value[key], f"{where}.{key}"
        if kind in facts.config_types:
            problems += (_fields(item, facts.config_types[kind], here) if isinstance(item, dict)
                         else [f"{here}: not an object"])
        elif kind == "strategy" and item not in facts.strategies:
            problems.append(f"{here}: {item!r} is not one of {', '.join(facts.strategies)}")
        elif kind == "interval" and item not in facts.intervals:
            problems.append(f"{here}: {item!r} is not one of {', '.join(facts.intervals)}")
        elif kind == "percent" and not (isinstance(item, int) and 0 <= item <= 100):
            problems.append(f"{here}: {item!r} is not a percentage 0-100")
        elif kind == "boolean" and not isinstance(item, bool):
            problems.append(f"{here}: {item!r} is not a boolean")
        elif kind == "string" and not isinstance(item, str):
            problems.append(f"{here}: {item!r} is not a string")
    return problems
